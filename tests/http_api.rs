//! The native HTTP API, end to end: every test starts the real `depot`
//! binary on a free port with its own data directory and talks to it over
//! real sockets, with reqwest or, where a client library would rewrite the
//! request (dot segments, oversized heads, bodies cut short), over raw TCP.
//!
//! Sections: objects, buckets, listings, batch routes, blobs / health /
//! metrics, ranges, conditional requests and object headers,
//! deduplication, bad input.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::{Server, client, encode, files_under, md5_hex, pattern, sha256_hex};
use reqwest::{Method, Response};
use serde_json::{Value, json};

/// The bucket every store has from its first start.
const B: &str = "files";

/// Request headers, as name and value.
type Headers<'a> = [(&'a str, &'a str)];

// ----- helpers: requests -----

/// Sends one request with extra headers and an optional body.
async fn send(method: Method, url: &str, headers: &Headers<'_>, body: Option<&[u8]>) -> Response {
    let mut req = client().request(method, url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if let Some(body) = body {
        req = req.body(body.to_vec());
    }
    req.send().await.expect("request")
}

/// A request without headers or body.
async fn call(method: Method, url: &str) -> Response {
    send(method, url, &[], None).await
}

async fn put(s: &Server, key: &str, body: &[u8], headers: &Headers<'_>) -> Response {
    send(Method::PUT, &s.object_url(B, key), headers, Some(body)).await
}

async fn get(s: &Server, key: &str, headers: &Headers<'_>) -> Response {
    send(Method::GET, &s.object_url(B, key), headers, None).await
}

async fn head(s: &Server, key: &str, headers: &Headers<'_>) -> Response {
    send(Method::HEAD, &s.object_url(B, key), headers, None).await
}

async fn delete(s: &Server, key: &str) -> Response {
    call(Method::DELETE, &s.object_url(B, key)).await
}

/// PUTs a key that must be new; returns the JSON answer.
async fn put_new(s: &Server, key: &str, body: &[u8]) -> Value {
    let r = put(s, key, body, &[]).await;
    assert_eq!(r.status(), 201, "PUT {key}");
    r.json().await.unwrap()
}

/// The body of a key, which must exist.
async fn read(s: &Server, key: &str) -> Vec<u8> {
    let r = get(s, key, &[]).await;
    assert_eq!(r.status(), 200, "GET {key}");
    r.bytes().await.unwrap().to_vec()
}

/// Asserts the key is absent: GET gives 404 NoSuchKey.
async fn assert_absent(s: &Server, key: &str) {
    expect_error(get(s, key, &[]).await, 404, "NoSuchKey").await;
}

/// Asserts a native error: the status and a JSON body with a code and a
/// message; returns the body.
async fn error_body(r: Response, status: u16) -> Value {
    assert_eq!(r.status(), status, "status of {}", r.url());
    let ct = header(&r, "content-type");
    assert!(ct.starts_with("application/json"), "content-type {ct:?}");
    let v: Value = r.json().await.expect("a JSON error body");
    assert!(v["error"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    v
}

/// Asserts a native error with this status and code.
async fn expect_error(r: Response, status: u16, code: &str) {
    let v = error_body(r, status).await;
    assert_eq!(v["error"], code, "{v}");
}

/// A response header as text; empty when absent.
fn header(r: &Response, name: &str) -> String {
    let value = r.headers().get(name).map(|v| v.to_str().unwrap());
    value.unwrap_or_default().to_string()
}

/// A JSON listing of `/{B}/{path}?{query}`.
async fn list(s: &Server, path: &str, query: &str) -> Value {
    let url = format!("{}/{B}/{}?{query}", s.url, encode(path));
    let r = send(Method::GET, &url, &[("accept", "application/json")], None).await;
    assert_eq!(r.status(), 200, "{url}");
    r.json().await.unwrap()
}

fn keys_of(listing: &Value) -> Vec<String> {
    let entries = listing["entries"].as_array().expect("entries");
    let key = |e: &Value| e["key"].as_str().unwrap().to_string();
    entries.iter().map(key).collect()
}

/// POSTs `body` to `/_/batch/{route}` for bucket B.
async fn batch(s: &Server, route: &str, body: &[u8]) -> Response {
    let url = format!("{}/_/batch/{route}?bucket={B}", s.url);
    send(Method::POST, &url, &[], Some(body)).await
}

async fn metrics(s: &Server) -> String {
    let r = call(Method::GET, &format!("{}/_/metrics", s.url)).await;
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// The value of an unlabelled metric.
fn gauge(text: &str, name: &str) -> i64 {
    let line = text.lines().find(|l| l.split(' ').next() == Some(name));
    let line = line.unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// The server still answers and has not panicked.
async fn assert_healthy(s: &Server) {
    let r = call(Method::GET, &format!("{}/_/health", s.url)).await;
    assert_eq!(r.status(), 200);
    s.assert_no_panic();
}

// ----- helpers: raw TCP -----

/// An answer read off a raw connection.
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        let mut all = self.headers.iter();
        let found = all.find(|(n, _)| n.eq_ignore_ascii_case(name));
        found.map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// A request head (`Connection: close`, and a Content-Length unless one
/// is given, spelled so) followed by `body`, sent as is.
fn raw_request(method: &str, path: &str, headers: &Headers<'_>, body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: depot\r\nConnection: close\r\n");
    if !headers.iter().any(|h| h.0 == "Content-Length") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    [head.as_bytes(), body].concat()
}

/// Sends `request`, optionally shuts the write half, and reads the answer
/// until the server closes. Write errors are tolerated: a server may
/// answer and close before it has read everything.
fn raw_exchange(addr: &str, request: &[u8], half_close: bool) -> RawResponse {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(request);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while let Ok(n @ 1..) = s.read(&mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    let end = find(&out, b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&out[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = common::status_of(lines.next().unwrap());
    let headers = lines.filter_map(|l| l.split_once(':'));
    let headers = headers.map(|(n, v)| (n.trim().to_string(), v.trim().to_string()));
    let mut r = RawResponse { status, headers: headers.collect(), body: out[end + 4..].to_vec() };
    if let Some(len) = r.header("content-length") {
        let len = len.parse().unwrap();
        r.body.truncate(len);
    }
    r
}

/// Sends one request over raw TCP and reads the answer.
fn raw(s: &Server, method: &str, path: &str, headers: &Headers<'_>, body: &[u8]) -> RawResponse {
    raw_exchange(&s.addr, &raw_request(method, path, headers, body), false)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Percent-encodes every byte but letters, digits and `/`: `..` becomes
/// `%2E%2E`, which the server decodes and no client normalises.
fn encode_all(key: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'/');
    percent_encoding::utf8_percent_encode(key, SET).to_string()
}

// ----- objects -----

#[tokio::test]
async fn put_answers_201_for_a_new_key_and_200_when_replacing() {
    let s = Server::start(&[]);
    let first = pattern(3000, 1);
    let v = put_new(&s, "dir/report.bin", &first).await;
    let want = json!({
        "bucket": B, "key": "dir/report.bin", "size": 3000, "etag": md5_hex(&first),
        "sha256": sha256_hex(&first), "deduplicated": false,
    });
    assert_eq!(v, want);

    let second = pattern(10, 2);
    let r = put(&s, "dir/report.bin", &second, &[]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!((&v["size"], &v["sha256"]), (&json!(10), &json!(sha256_hex(&second))));
    assert_eq!(read(&s, "dir/report.bin").await, second);
}

#[tokio::test]
async fn get_head_and_delete_an_object() {
    let s = Server::start(&[]);
    let body = pattern(5000, 3);
    put_new(&s, "k", &body).await;
    assert_eq!(read(&s, "k").await, body);

    let r = head(&s, "k", &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-length"), "5000");
    assert!(r.bytes().await.unwrap().is_empty(), "HEAD has no body");

    assert_eq!(delete(&s, "k").await.status(), 204);
    assert_absent(&s, "k").await;
    expect_error(delete(&s, "k").await, 404, "NoSuchKey").await;
}

// ----- buckets -----

#[tokio::test]
async fn bucket_files_exists_from_the_first_start() {
    let s = Server::start(&[]);
    let root = format!("{}/", s.url);
    let r = send(Method::GET, &root, &[("accept", "application/json")], None).await;
    let v: Value = r.json().await.unwrap();
    let buckets = v["buckets"].as_array().unwrap();
    let names: Vec<&Value> = buckets.iter().map(|b| &b["name"]).collect();
    assert_eq!(names, [B]);
    assert_eq!(keys_of(&list(&s, "", "").await), Vec::<String>::new());
}

#[tokio::test]
async fn buckets_are_created_and_only_deleted_when_empty() {
    let s = Server::start(&[]);
    let bucket = format!("{}/photos", s.url);
    assert_eq!(call(Method::PUT, &bucket).await.status(), 201);

    let obj = s.object_url("photos", "cat.png");
    let r = send(Method::PUT, &obj, &[], Some(b"meow")).await;
    assert_eq!(r.status(), 201);
    expect_error(call(Method::DELETE, &bucket).await, 409, "BucketNotEmpty").await;

    assert_eq!(call(Method::DELETE, &obj).await.status(), 204);
    assert_eq!(call(Method::DELETE, &bucket).await.status(), 204);
    expect_error(call(Method::DELETE, &bucket).await, 404, "NoSuchBucket").await;
    let r = send(Method::PUT, &obj, &[], Some(b"meow")).await;
    expect_error(r, 404, "NoSuchBucket").await;
    expect_error(call(Method::GET, &obj).await, 404, "NoSuchBucket").await;
}

// ----- listings -----

#[tokio::test]
async fn json_listing_gives_entries_dirs_and_next() {
    let s = Server::start(&[]);
    for key in ["docs/a.txt", "docs/b.txt", "docs/sub/c.txt", "top.bin"] {
        put_new(&s, key, key.as_bytes()).await;
    }
    let root = list(&s, "", "").await;
    assert_eq!(keys_of(&root), ["top.bin"]);
    assert_eq!(root["dirs"], json!(["docs/"]));
    assert!(root["next"].is_null(), "{root}");
    let entry = &root["entries"][0];
    assert_eq!(entry["size"], 7);
    assert_eq!(entry["etag"], md5_hex(b"top.bin"));
    let modified = humantime::parse_rfc3339(entry["modified"].as_str().unwrap()).unwrap();
    let age = SystemTime::now().duration_since(modified);
    assert!(age.unwrap_or_default().as_secs() < 300, "recent: {entry}");

    let docs = list(&s, "docs/", "").await;
    assert_eq!(keys_of(&docs), ["docs/a.txt", "docs/b.txt"]);
    assert_eq!(docs["dirs"], json!(["docs/sub/"]));

    // The form follows Accept, and says so to caches.
    let url = format!("{}/{B}/docs/", s.url);
    for accept in ["application/json", "text/html", "*/*"] {
        let r = send(Method::GET, &url, &[("accept", accept)], None).await;
        assert_eq!(header(&r, "vary"), "Accept", "{accept}");
    }
    assert_eq!(header(&send(Method::GET, &s.url, &[("accept", "application/json")], None).await, "vary"), "Accept");
}

#[tokio::test]
async fn html_listing_shows_escaped_key_names() {
    let s = Server::start(&[]);
    put_new(&s, "plain.txt", b"x").await;
    put_new(&s, "<b>bold&co.txt", b"y").await;
    let url = format!("{}/{B}/", s.url);
    // Browsers get the web UI; other clients (curl's */*) the plain table.
    let r = send(Method::GET, &url, &[("accept", "text/html,application/xhtml+xml,*/*;q=0.8")], None).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("/_/ui/app.js"));
    // A client that prefers JSON gets JSON, whatever else it accepts.
    let r = send(Method::GET, &url, &[("accept", "application/json, text/html;q=0.1")], None).await;
    assert!(header(&r, "content-type").starts_with("application/json"));
    assert_eq!(keys_of(&r.json().await.unwrap()), ["<b>bold&co.txt", "plain.txt"]);
    let r = send(Method::GET, &url, &[("accept", "*/*")], None).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/html"));
    let html = r.text().await.unwrap();
    assert!(html.contains("plain.txt"), "{html}");
    assert!(html.contains("&lt;b&gt;bold&amp;co.txt"), "{html}");
    assert!(!html.contains("<b>bold"), "unescaped key: {html}");
}

#[tokio::test]
async fn html_listing_links_survive_dot_segments_in_keys() {
    let s = Server::start(&[]);
    // The key `d/sub/../x`, its `/` before `..` escaped so reqwest keeps it.
    let r = send(Method::PUT, &format!("{}/{B}/d/sub%2F../x", s.url), &[], Some(b"trap")).await;
    assert_eq!(r.status(), 201);
    put_new(&s, "d/other", b"o").await;
    let listing =
        |url: String| async move { send(Method::GET, &url, &[("accept", "*/*")], None).await.text().await.unwrap() };
    let html = listing(format!("{}/{B}/d/sub/", s.url)).await;
    let href = html.split("href=\"").nth(2).and_then(|h| h.split('"').next()).expect("the folder's link");
    // Followed as a browser would, the link leads to the folder `d/sub/../`,
    // not to `d/`, which the dot segment would make of it.
    let url = reqwest::Url::parse(&format!("{}/{B}/d/sub/", s.url)).unwrap().join(href).unwrap();
    let html = listing(url.to_string()).await;
    assert!(html.contains(">x<") && !html.contains("other"), "{url}: {html}");
    // A key that is nothing but a dot segment is listed by name, unlinked:
    // a browser would take any link to it for the bucket or its parent.
    for key in [".", ".."] {
        let request = format!("PUT /{B}/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nd");
        let answer = common::raw(&s.addr, request.as_bytes(), Duration::from_secs(1));
        assert_eq!(common::status_of(&answer), 201, "{answer}");
    }
    let html = listing(format!("{}/{B}/", s.url)).await;
    assert!(html.contains("<td>.</td>") && html.contains("<td>..</td>"), "{html}");
    for key in [".", ".."] {
        assert!(!html.contains(&format!("href=\"/{B}/{key}\"")), "{html}");
    }
}

#[tokio::test]
async fn the_web_uis_assets_are_revalidated_by_their_etag() {
    let s = Server::start(&[]);
    let url = format!("{}/_/ui/app.js", s.url);
    let tag = header(&call(Method::GET, &url).await, "etag");
    let weak = format!("W/{tag}");
    for condition in [tag.as_str(), weak.as_str(), "*", "\"other\", *"] {
        let r = send(Method::GET, &url, &[("if-none-match", condition)], None).await;
        assert_eq!(r.status(), 304, "{condition}");
    }
    assert_eq!(send(Method::GET, &url, &[("if-none-match", "\"other\"")], None).await.status(), 200);
}

#[tokio::test]
async fn the_html_listings_next_page_keeps_its_search_by_prefix() {
    let s = Server::start(&[]);
    for key in ["x1", "x2", "x3", "y1"] {
        put_new(&s, key, b"x").await;
    }
    let url = format!("{}/{B}/?prefix=x&limit=2", s.url);
    let html = send(Method::GET, &url, &[("accept", "*/*")], None).await.text().await.unwrap();
    assert!(html.contains("href=\"?prefix=x&amp;after=x2&amp;limit=2\""), "{html}");
    let next = format!("{}/{B}/?prefix=x&after=x2&limit=2", s.url);
    let html = send(Method::GET, &next, &[("accept", "*/*")], None).await.text().await.unwrap();
    assert!(html.contains("x3") && !html.contains("y1"), "{html}");
}

/// A search by prefix within a folder names the keys found as the folder
/// does, and links to the folder's parent.
#[tokio::test]
async fn a_search_within_a_folder_shows_the_folders_names() {
    let s = Server::start(&[]);
    for key in ["docs/hello.txt", "docs/help/a", "docs/other"] {
        put_new(&s, key, b"x").await;
    }
    let url = format!("{}/{B}/docs/?prefix=he", s.url);
    let html = send(Method::GET, &url, &[("accept", "*/*")], None).await.text().await.unwrap();
    assert!(html.contains(">hello.txt<") && html.contains(">help/<") && !html.contains("other"), "{html}");
    assert!(html.contains(&format!("href=\"/{B}/\">../<")), "{html}");
}

#[tokio::test]
async fn listing_pages_with_after_and_limit_visit_every_key_once() {
    let s = Server::start(&[]);
    let want: BTreeSet<String> = (0..23).map(|i| format!("page/{i:03}")).collect();
    for key in &want {
        put_new(&s, key, b"p").await;
    }
    let mut seen = Vec::new();
    let mut query = "limit=5".to_string();
    for _ in 0..10 {
        let page = list(&s, "page/", &query).await;
        let keys = keys_of(&page);
        assert!(keys.len() <= 5, "{page}");
        seen.extend(keys);
        let Some(next) = page["next"].as_str() else {
            break;
        };
        query = format!("limit=5&after={}", encode_all(next));
    }
    assert_eq!(seen.len(), want.len(), "each key once: {seen:?}");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), want);
}

// ----- batch routes -----

#[tokio::test]
async fn batch_get_answers_each_key_in_request_order() {
    let s = Server::start(&[]);
    let a = b"alpha\nwith a newline";
    put_new(&s, "a", a).await;
    put_new(&s, "empty", b"").await;
    let r = batch(&s, "get", b"missing\nempty\na\nmissing-too\na\n").await;
    assert_eq!(r.status(), 200);
    let pieces: [&[u8]; 5] = [b"-1\n0\n\n20\n", a, b"\n-1\n20\n", a, b"\n"];
    assert_eq!(r.bytes().await.unwrap(), pieces.concat());
}

#[tokio::test]
async fn a_batch_looked_up_in_several_windows_is_answered_in_request_order() {
    let s = Server::start(&[]);
    // 1,700 small values and one streamed past the small-object size; in
    // the first window, 7 MB of values of 60 KB, more than one read of
    // small objects takes.
    const STORED: usize = 1700;
    let value = |i: usize| match i {
        300 => pattern(70_000, 5),
        i if i < 600 && i % 5 == 0 => pattern(60_000, 100 + i as u64),
        i => format!("value {i}").into_bytes(),
    };
    let mut put = Vec::new();
    for i in 0..STORED {
        let v = value(i);
        put.extend_from_slice(format!("k{i}\n{}\n", v.len()).as_bytes());
        put.extend_from_slice(&v);
        put.push(b'\n');
    }
    assert_eq!(batch(&s, "put", &put).await.status(), 200);
    // 5,000 keys: the first window's all stored, the later ones' all
    // missing, so the later lookups, looked up beside it, end first.
    let (mut keys, mut want) = (String::new(), Vec::new());
    for i in 0..5000 {
        keys.push_str(&format!("k{i}\n"));
        if i < STORED {
            let v = value(i);
            want.extend_from_slice(format!("{}\n", v.len()).as_bytes());
            want.extend_from_slice(&v);
            want.push(b'\n');
        } else {
            want.extend_from_slice(b"-1\n");
        }
    }
    let r = batch(&s, "get", keys.as_bytes()).await;
    assert_eq!(r.status(), 200);
    let got = r.bytes().await.unwrap();
    assert!(got == want, "the answer differs from byte {:?}", got.iter().zip(&want).position(|(a, b)| a != b));
}

#[tokio::test]
async fn batch_put_stores_every_entry() {
    let s = Server::start(&[]);
    let big = pattern(70_000, 4);
    let head = b"one\n3\nabc\nempty\n0\n\nbig.bin\n70000\n";
    let r = batch(&s, "put", &[&head[..], &big, b"\n"].concat()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["stored"], 3);
    assert_eq!(read(&s, "one").await, b"abc");
    assert_eq!(read(&s, "empty").await, b"");
    assert_eq!(read(&s, "big.bin").await, big);
}

#[tokio::test]
async fn batch_put_with_a_malformed_last_entry_stores_nothing() {
    let s = Server::start(&[]);
    let good = b"one\n3\nabc\ntwo\n3\ndef\n";
    // A length past the end, lengths that are no number (a sign is not a
    // digit), no final newline.
    let tails: [&[u8]; 4] = [b"three\n10\nabc\n", b"three\nten\nabc\n", b"three\n+3\nabc\n", b"three\n3\nabc"];
    for tail in tails {
        error_body(batch(&s, "put", &[&good[..], tail].concat()).await, 400).await;
        for key in ["one", "two", "three"] {
            assert_absent(&s, key).await;
        }
    }
    assert_healthy(&s).await;
}

#[tokio::test]
async fn batch_delete_removes_the_listed_keys() {
    let s = Server::start(&[]);
    put_new(&s, "a", b"1").await;
    put_new(&s, "b", b"2").await;
    let r = batch(&s, "delete", b"a\nnever-stored\n").await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!((&v["deleted"], &v["missing"]), (&json!(1), &json!(1)));
    assert_absent(&s, "a").await;
    assert_eq!(read(&s, "b").await, b"2");
}

/// A condition on a batch that writes would hold for every entry, which
/// the batch routes do not check: it is refused, and nothing changes.
#[tokio::test]
async fn conditional_batch_writes_are_refused() {
    let s = Server::start(&[]);
    put_new(&s, "a", b"1").await;
    for (route, body) in [("put", &b"a\n1\nx\n"[..]), ("delete", b"a\n")] {
        let url = format!("{}/_/batch/{route}?bucket={B}", s.url);
        let r = send(Method::POST, &url, &[("if-none-match", "*")], Some(body)).await;
        assert_eq!(r.status(), 400, "{route}");
        assert!(r.text().await.unwrap().contains("take no conditions"), "{route}");
    }
    assert_eq!(read(&s, "a").await, b"1");
    // So is a digest of the body, which would be one for the whole batch,
    // not for any entry: refused rather than left unchecked.
    let zeros = "0".repeat(64);
    let digests =
        [("content-md5", "AAAAAAAAAAAAAAAAAAAAAA=="), ("x-depot-sha256", &zeros), ("x-amz-checksum-crc32", "AAAAAA==")];
    for (name, value) in digests {
        let url = format!("{}/_/batch/put?bucket={B}", s.url);
        let r = send(Method::POST, &url, &[(name, value)], Some(b"a\n1\ny\n")).await;
        assert_eq!(r.status(), 400, "{name}");
        assert!(r.text().await.unwrap().contains(name), "{name}");
    }
    assert_eq!(read(&s, "a").await, b"1");
}

/// A batch get's answer outlives its objects, as a single GET's does: the
/// collector leaves the blobs of the windows it has looked up alone until
/// they are sent, though their keys are deleted meanwhile.
#[tokio::test]
async fn a_batch_get_is_answered_whole_though_its_objects_go_meanwhile() {
    let s = Server::start(&["--gc-grace", "0", "--gc-interval", "1"]);
    let (n, size) = (20, 1_000_000);
    // An entry as a batch put sends it and a batch get answers it, after
    // the key: its length, its bytes, a newline.
    let entry = |i: u64| [format!("{size}\n").as_bytes(), &pattern(size, i), b"\n"].concat();
    let keys: String = (0..n).map(|i| format!("k{i}\n")).collect();
    let put: Vec<u8> = (0..n).flat_map(|i| [format!("k{i}\n").into_bytes(), entry(i)].concat()).collect();
    assert_eq!(batch(&s, "put", &put).await.status(), 200);
    let mut answer = batch(&s, "get", keys.as_bytes()).await;
    assert_eq!(answer.status(), 200);
    let mut got = answer.chunk().await.unwrap().unwrap().to_vec();
    assert_eq!(batch(&s, "delete", keys.as_bytes()).await.status(), 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    while let Some(chunk) = answer.chunk().await.expect("the answer was not cut short") {
        got.extend_from_slice(&chunk);
    }
    let expected: Vec<u8> = (0..n).flat_map(entry).collect();
    assert!(got == expected, "{} bytes of {}", got.len(), expected.len());
}

// ----- blobs, health, metrics -----

#[tokio::test]
async fn blobs_are_served_by_sha256() {
    let s = Server::start(&[]);
    let body = pattern(1234, 5);
    put_new(&s, "x", &body).await;
    let blob = |hex: &str| format!("{}/_/blobs/{hex}", s.url);
    let r = call(Method::GET, &blob(&sha256_hex(&body))).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), body);
    let unknown = sha256_hex(b"never stored");
    expect_error(call(Method::GET, &blob(&unknown)).await, 404, "NoSuchBlob").await;
    for bad in ["xyz", &unknown[..63], &"g".repeat(64)] {
        let r = call(Method::GET, &blob(bad)).await;
        expect_error(r, 400, "InvalidRequest").await;
    }
}

#[tokio::test]
async fn health_and_prometheus_metrics() {
    let s = Server::start(&[]);
    assert_healthy(&s).await;
    let before = metrics(&s).await;
    for name in [
        "depot_http_requests_total{",
        "depot_http_request_duration_seconds_bucket{",
        "depot_objects ",
        "depot_blobs ",
        "depot_dedup_saved_bytes ",
    ] {
        assert!(before.contains(name), "{name} missing:\n{before}");
    }
    let body = pattern(1000, 6);
    for key in ["m1", "m2", "m3"] {
        put_new(&s, key, &body).await;
    }
    let after = metrics(&s).await;
    let delta = |name| gauge(&after, name) - gauge(&before, name);
    assert_eq!(delta("depot_objects"), 3);
    assert_eq!(delta("depot_blobs"), 1);
    assert_eq!(delta("depot_dedup_saved_bytes"), 2000);
    let puts = "depot_http_requests_total{method=\"PUT\",status=\"201\"} 3\n";
    assert!(after.contains(puts), "{after}");
    let catalog_secs = after.lines().find_map(|l| l.strip_prefix("depot_put_seconds_total{phase=\"catalog\"} "));
    assert!(catalog_secs.and_then(|v| v.parse::<f64>().ok()).is_some_and(|t| t > 0.0), "{after}");
    // The three keys share one body: the first read goes to the engine,
    // the others are answered from memory.
    for key in ["m1", "m2", "m1"] {
        assert_eq!(read(&s, key).await, body);
    }
    let read_after = metrics(&s).await;
    let delta = |name| gauge(&read_after, name) - gauge(&after, name);
    assert_eq!((delta("depot_hot_misses_total"), delta("depot_hot_hits_total")), (1, 2), "{read_after}");
    assert!(delta("depot_hot_bytes") >= 1000, "{read_after}");
    // HEAD sends no body: the bytes sent since are the last metrics answer.
    for _ in 0..3 {
        assert_eq!(call(Method::HEAD, &format!("{}/{B}/m1", s.url)).await.status(), 200);
    }
    let headed = metrics(&s).await;
    let sent = gauge(&headed, "depot_http_sent_bytes_total") - gauge(&read_after, "depot_http_sent_bytes_total");
    assert_eq!(sent, read_after.len() as i64, "HEAD counted as sent bytes");

    let stats: serde_json::Value = call(Method::GET, &format!("{}/_/stats", s.url)).await.json().await.unwrap();
    assert_eq!((stats["engine"].as_str(), stats["objects"].as_i64()), (Some("hybrid"), Some(3)));
    assert_eq!(stats["dedup_saved_bytes"].as_i64(), Some(2000));
    assert!(stats["disk_bytes"].as_u64().is_some_and(|n| n > 0), "{stats}");
    assert!(stats["put_seconds"]["bytes"].as_f64().is_some_and(|t| t > 0.0), "{stats}");
    assert_eq!((stats["hot"]["hits"].as_u64(), stats["hot"]["misses"].as_u64()), (Some(2), Some(1)), "{stats}");
}

// ----- ranges -----

/// A GET of `key` with a Range header and `more` headers.
async fn ranged(s: &Server, key: &str, range: &str, more: &Headers<'_>) -> Response {
    let mut headers = vec![("range", range)];
    headers.extend_from_slice(more);
    get(s, key, &headers).await
}

/// Asserts a 206 of one range of `body`: the bytes, Content-Length and
/// Content-Range.
async fn assert_partial(r: Response, body: &[u8], want: Range<usize>) {
    let (a, b, len) = (want.start, want.end, body.len());
    assert_eq!(r.status(), 206, "{}", r.url());
    assert_eq!(header(&r, "content-range"), format!("bytes {a}-{}/{len}", b - 1));
    assert_eq!(header(&r, "content-length"), (b - a).to_string());
    assert_eq!(r.bytes().await.unwrap(), body[want]);
}

#[tokio::test]
async fn single_ranges_give_206_with_content_range() {
    let s = Server::start(&[]);
    let body = pattern(1000, 7);
    put_new(&s, "r", &body).await;
    for (range, want) in [
        ("bytes=0-99", 0..100),
        ("bytes=900-", 900..1000),
        ("bytes=-100", 900..1000),
        ("bytes=990-5000", 990..1000),
        ("bytes=5-5", 5..6),
    ] {
        assert_partial(ranged(&s, "r", range, &[]).await, &body, want).await;
    }
    // A HEAD answers what its GET would, without the body.
    let r = head(&s, "r", &[("range", "bytes=900-")]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(
        (header(&r, "content-range"), header(&r, "content-length")),
        ("bytes 900-999/1000".into(), "100".into())
    );
    assert!(r.bytes().await.unwrap().is_empty());
    let r = head(&s, "r", &[("range", "bytes=0-0,5-5")]).await;
    assert_eq!(r.status(), 206);
    assert!(header(&r, "content-type").starts_with("multipart/byteranges"));
    assert_eq!(head(&s, "r", &[("range", "bytes=2000-")]).await.status(), 416);
}

/// The parts of a multipart/byteranges body: (Content-Range, bytes).
fn multipart_parts(body: &[u8], boundary: &str) -> Vec<(String, Vec<u8>)> {
    let delimiter = format!("\r\n--{boundary}").into_bytes();
    let mut pieces = Vec::new();
    let mut rest = body;
    while let Some(at) = find(rest, &delimiter) {
        pieces.push(&rest[..at]);
        rest = &rest[at + delimiter.len()..];
    }
    assert_eq!(rest, b"--\r\n", "the body ends with the closing delimiter");
    assert_eq!(pieces.remove(0), b"", "nothing before the first part");
    let part = |p: &[u8]| {
        let p = p.strip_prefix(b"\r\n").expect("CRLF after the delimiter");
        let end = find(p, b"\r\n\r\n").expect("part headers");
        let headers = String::from_utf8(p[..end].to_vec()).unwrap();
        let mut lines = headers.lines();
        let range = lines.find_map(|l| l.strip_prefix("Content-Range: "));
        let range = range.expect("Content-Range").to_string();
        (range, p[end + 4..].to_vec())
    };
    pieces.into_iter().map(part).collect()
}

#[tokio::test]
async fn several_ranges_give_multipart_byteranges() {
    let s = Server::start(&[]);
    let body = pattern(1000, 8);
    put_new(&s, "m.bin", &body).await;
    let r = ranged(&s, "m.bin", "bytes=0-9, 500-519, -5", &[]).await;
    assert_eq!(r.status(), 206);
    let ct = header(&r, "content-type");
    let boundary = ct.strip_prefix("multipart/byteranges; boundary=").expect(&ct);
    // A multipart document is a type browsers may render: it gets the
    // sandbox whatever type the object itself has.
    assert!(header(&r, "content-security-policy").starts_with("sandbox"), "{ct}");
    let declared: usize = header(&r, "content-length").parse().unwrap();
    let bytes = r.bytes().await.unwrap();
    assert_eq!(bytes.len(), declared, "Content-Length of the multipart body");
    let parts = multipart_parts(&bytes, boundary);
    let want = [0..10, 500..520, 995..1000];
    assert_eq!(parts.len(), want.len());
    for ((range, got), w) in parts.iter().zip(want) {
        assert_eq!(range, &format!("bytes {}-{}/1000", w.start, w.end - 1));
        assert_eq!(got, &body[w], "bytes of {range}");
    }
}

/// The stored Content-Encoding is the object's: each part of several
/// ranges carries its bytes, but the multipart answer is not encoded.
#[tokio::test]
async fn several_ranges_of_an_encoded_object_name_the_coding_in_each_part() {
    let s = Server::start(&[]);
    let body = pattern(1000, 8);
    let r = put(&s, "z", &body, &[("content-encoding", "gzip")]).await;
    assert_eq!(r.status(), 201);
    let r = ranged(&s, "z", "bytes=0-9, 20-29", &[]).await;
    assert_eq!(r.status(), 206);
    assert_eq!(header(&r, "content-encoding"), "");
    let ct = header(&r, "content-type");
    let boundary = ct.strip_prefix("multipart/byteranges; boundary=").expect(&ct).to_string();
    let text = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
    assert_eq!(text.matches("\r\nContent-Encoding: gzip\r\n").count(), 2, "{text}");
    assert_eq!(multipart_parts(text.as_bytes(), &boundary).len(), 2);
    let r = ranged(&s, "z", "bytes=0-9", &[]).await;
    assert_eq!(header(&r, "content-encoding"), "gzip", "one range is of the encoded object");
}

#[tokio::test]
async fn unsatisfiable_ranges_give_416_with_the_length() {
    let s = Server::start(&[]);
    put_new(&s, "r", &pattern(1000, 9)).await;
    put_new(&s, "empty", b"").await;
    for (key, range, len) in [
        ("r", "bytes=1000-", 1000),
        ("r", "bytes=2000-3000, 5000-", 1000),
        ("empty", "bytes=0-", 0),
        ("empty", "bytes=0-0", 0),
    ] {
        let r = ranged(&s, key, range, &[]).await;
        let star = format!("bytes */{len}");
        assert_eq!(header(&r, "content-range"), star, "{key} {range}");
        expect_error(r, 416, "InvalidRange").await;
    }
}

#[tokio::test]
async fn invalid_range_syntax_is_ignored() {
    let s = Server::start(&[]);
    let body = pattern(100, 10);
    put_new(&s, "r", &body).await;
    for range in ["bytes=5-1", "bytes=abc", "items=0-1", "bytes=", "bytes=--1"] {
        let r = ranged(&s, "r", range, &[]).await;
        assert_eq!(r.status(), 200, "{range}");
        assert!(r.headers().get("content-range").is_none());
        assert_eq!(r.bytes().await.unwrap(), body, "{range}");
    }
}

#[tokio::test]
async fn if_range_serves_partially_only_while_the_validator_matches() {
    let s = Server::start(&[]);
    let body = pattern(100, 11);
    put_new(&s, "r", &body).await;
    let plain = get(&s, "r", &[]).await;
    let (etag, modified) = (header(&plain, "etag"), header(&plain, "last-modified"));
    let r = ranged(&s, "r", "bytes=0-9", &[("if-range", &etag)]).await;
    assert_partial(r, &body, 0..10).await;
    // A date is a weak validator: a second version within the same second,
    // or one given the same time, would otherwise be spliced onto the
    // first. The whole object is answered.
    let other_date = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(86400));
    for stale in ["\"0123456789abcdef0123456789abcdef\"", &other_date, &modified] {
        let r = ranged(&s, "r", "bytes=0-9", &[("if-range", stale)]).await;
        assert_eq!(r.status(), 200, "If-Range {stale}");
        assert_eq!(r.bytes().await.unwrap(), body);
    }
}

// ----- conditional requests and object headers -----

#[tokio::test]
async fn objects_carry_etag_last_modified_and_digest_headers() {
    let s = Server::start(&[]);
    let body = pattern(777, 12);
    put_new(&s, "h", &body).await;
    for r in [get(&s, "h", &[]).await, head(&s, "h", &[]).await] {
        assert_eq!(header(&r, "etag"), format!("\"{}\"", md5_hex(&body)));
        assert_eq!(header(&r, "x-depot-sha256"), sha256_hex(&body));
        assert_eq!(header(&r, "accept-ranges"), "bytes");
        assert_eq!(header(&r, "content-length"), "777");
        let modified = httpdate::parse_http_date(&header(&r, "last-modified")).unwrap();
        let age = SystemTime::now().duration_since(modified);
        assert!(age.unwrap_or_default().as_secs() < 300);
    }
}

/// As S3 keeps them: Cache-Control, Content-Disposition, Content-Encoding,
/// Content-Language and Expires given with a PUT come back with the object.
#[tokio::test]
async fn headers_given_with_a_put_come_back_with_the_object() {
    let s = Server::start(&[]);
    let expires = "Wed, 21 Oct 2099 07:28:00 GMT";
    let given: &Headers = &[
        ("cache-control", "public, max-age=600"),
        ("content-disposition", "attachment; filename=\"report.csv\""),
        ("content-encoding", "gzip"),
        ("content-language", "de-CH"),
        ("expires", expires),
    ];
    assert_eq!(put(&s, "stored", b"gzipped bytes", given).await.status(), 201);
    for r in [get(&s, "stored", &[]).await, head(&s, "stored", &[]).await] {
        for (name, value) in given {
            assert_eq!(header(&r, name), *value, "{name}");
        }
    }
    // A 304 carries the caching headers a 200 would (RFC 9110 15.4.5).
    let etag = header(&head(&s, "stored", &[]).await, "etag");
    let r = get(&s, "stored", &[("if-none-match", &etag)]).await;
    assert_eq!(r.status(), 304);
    assert_eq!((header(&r, "cache-control"), header(&r, "expires")), ("public, max-age=600".into(), expires.into()));
    // ?download names the file for the browser, over what is stored.
    let r = send(Method::GET, &format!("{}?download", s.object_url(B, "stored")), &[], None).await;
    assert!(header(&r, "content-disposition").contains("filename=\"stored\""));
    // Replacing the object replaces its headers.
    assert_eq!(put(&s, "stored", b"plain", &[]).await.status(), 200);
    let r = get(&s, "stored", &[]).await;
    for (name, _) in given {
        assert!(r.headers().get(*name).is_none(), "{name} outlived the object it came with");
    }
    // A list given in several lines is kept whole, as one line.
    let r = put(&s, "listed", b"x", &[("cache-control", "public"), ("cache-control", "max-age=60")]).await;
    assert_eq!(r.status(), 201);
    assert_eq!(header(&get(&s, "listed", &[]).await, "cache-control"), "public, max-age=60");
    // Refused whole: an Expires that is not a date, or two of them, a value
    // that is not ASCII.
    let r = put(&s, "bad", b"x", &[("expires", "tomorrow")]).await;
    expect_error(r, 400, "InvalidRequest").await;
    let r = put(&s, "bad", b"x", &[("expires", expires), ("expires", "Thu, 01 Jan 2037 00:00:00 GMT")]).await;
    expect_error(r, 400, "InvalidRequest").await;
    for name in ["Content-Language", "Content-Type"] {
        let r = raw(&s, "PUT", &format!("/{B}/bad"), &[(name, "français")], b"x");
        assert_eq!(r.status, 400, "{name}");
    }
    // Every answer about the object and every listing entry carries them:
    // 8 KB at most, as S3 takes a PUT's headers.
    let long = format!("text/plain; x={}", "a".repeat(8192));
    let r = put(&s, "bad", b"x", &[("content-type", &long)]).await;
    expect_error(r, 400, "RequestHeaderSectionTooLarge").await;
    let disposition = format!("attachment; filename=\"{}\"", "d".repeat(4100));
    let r = put(&s, "bad", b"x", &[("content-disposition", &disposition), ("cache-control", &"c".repeat(4100))]).await;
    expect_error(r, 400, "RequestHeaderSectionTooLarge").await;
    assert_absent(&s, "bad").await;
}

/// An uploaded page would run in the web UI's origin: it gets a sandbox
/// of its own. A PDF must not (browsers refuse to show sandboxed PDFs).
#[tokio::test]
async fn uploaded_pages_are_sandboxed_and_types_are_not_sniffed() {
    let s = Server::start(&[]);
    put_new(&s, "page.html", b"<script>sessionStorage</script>").await;
    put_new(&s, "drawing.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>").await;
    put_new(&s, "doc.pdf", b"%PDF-1.4").await;
    let r = put(&s, "feed", b"<rss/>", &[("content-type", "application/rss+xml")]).await;
    assert_eq!(r.status(), 201);
    // Browsers take the last of a list: these are HTML to them.
    for (key, listed) in [("list", "text/plain,text/html"), ("quoted", "text/plain; x=\"a,text/html\"")] {
        assert_eq!(put(&s, key, b"<script>sessionStorage</script>", &[("content-type", listed)]).await.status(), 201);
    }
    for key in ["page.html", "drawing.svg", "feed", "list", "quoted"] {
        let r = get(&s, key, &[]).await;
        assert!(header(&r, "content-security-policy").starts_with("sandbox"), "{key}");
        assert!(!header(&r, "content-security-policy").contains("allow-same-origin"), "{key}");
    }
    let r = get(&s, "doc.pdf", &[]).await;
    assert_eq!(header(&r, "content-security-policy"), "");
    assert_eq!(header(&r, "x-content-type-options"), "nosniff");
    // The server's own answers, listings and errors, are what they say too.
    for url in [format!("{}/{B}/?format=json", s.url), format!("{}/{B}/", s.url), format!("{}/{B}/missing", s.url)] {
        assert_eq!(header(&call(Method::GET, &url).await, "x-content-type-options"), "nosniff", "{url}");
    }
}

#[tokio::test]
async fn matching_if_none_match_or_if_modified_since_gives_304() {
    let s = Server::start(&[]);
    let body = pattern(50, 13);
    put_new(&s, "c", &body).await;
    let plain = get(&s, "c", &[]).await;
    let (etag, modified) = (header(&plain, "etag"), header(&plain, "last-modified"));
    for cond in [("if-none-match", &*etag), ("if-modified-since", &*modified)] {
        for r in [get(&s, "c", &[cond]).await, head(&s, "c", &[cond]).await] {
            assert_eq!(r.status(), 304, "{cond:?}");
            assert_eq!(header(&r, "etag"), etag);
            assert_eq!(header(&r, "x-depot-sha256"), sha256_hex(&body));
            assert!(r.bytes().await.unwrap().is_empty());
        }
    }
    let r = get(&s, "c", &[("if-none-match", "\"something-else\"")]).await;
    assert_eq!(r.status(), 200);
    let earlier = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(3600));
    let r = get(&s, "c", &[("if-modified-since", &earlier)]).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn put_with_if_none_match_star_only_creates() {
    let s = Server::start(&[]);
    let star = [("if-none-match", "*")];
    assert_eq!(put(&s, "once", b"first", &star).await.status(), 201);
    let r = put(&s, "once", b"second", &star).await;
    expect_error(r, 412, "PreconditionFailed").await;
    // RFC 9110 section 5.3: a list header's lines make one list, so a `*`
    // on a second line binds as much as on the first.
    let r = put(&s, "once", b"third", &[("if-none-match", "\"other\""), ("if-none-match", "*")]).await;
    expect_error(r, 412, "PreconditionFailed").await;
    assert_eq!(read(&s, "once").await, b"first");
}

#[tokio::test]
async fn if_match_mismatch_gives_412_on_get_and_put() {
    let s = Server::start(&[]);
    put_new(&s, "m", b"v1").await;
    let wrong = [("if-match", "\"0123456789abcdef0123456789abcdef\"")];
    expect_error(get(&s, "m", &wrong).await, 412, "PreconditionFailed").await;
    expect_error(put(&s, "m", b"v2", &wrong).await, 412, "PreconditionFailed").await;
    assert_eq!(read(&s, "m").await, b"v1");
    let right = format!("\"{}\"", md5_hex(b"v1"));
    let r = put(&s, "m", b"v2", &[("if-match", &right)]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(read(&s, "m").await, b"v2");
}

#[tokio::test]
async fn writes_honour_every_condition_and_if_match_compares_strongly() {
    let s = Server::start(&[]);
    put_new(&s, "c", b"v1").await;
    let tag = format!("\"{}\"", md5_hex(b"v1"));
    let weak = format!("W/{tag}");
    // RFC 9110 section 13.1.1: a weak tag never matches If-Match.
    expect_error(get(&s, "c", &[("if-match", &weak)]).await, 412, "PreconditionFailed").await;
    expect_error(put(&s, "c", b"v2", &[("if-match", &weak)]).await, 412, "PreconditionFailed").await;
    expect_error(
        send(Method::DELETE, &s.object_url(B, "c"), &[("if-match", &weak)], None).await,
        412,
        "PreconditionFailed",
    )
    .await;
    // If-None-Match with the current tag, and If-Unmodified-Since before
    // the object changed, refuse the write.
    expect_error(put(&s, "c", b"v2", &[("if-none-match", &tag)]).await, 412, "PreconditionFailed").await;
    let long_ago = [("if-unmodified-since", "Mon, 01 Jan 2001 00:00:00 GMT")];
    expect_error(put(&s, "c", b"v2", &long_ago).await, 412, "PreconditionFailed").await;
    assert_eq!(read(&s, "c").await, b"v1");
    let r = put(
        &s,
        "c",
        b"v2",
        &[("if-none-match", "\"other\""), ("if-unmodified-since", "Fri, 01 Jan 2100 00:00:00 GMT")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(read(&s, "c").await, b"v2");
}

#[tokio::test]
async fn a_suffix_range_of_an_empty_object_is_the_empty_object() {
    let s = Server::start(&[]);
    put_new(&s, "empty", b"").await;
    let r = get(&s, "empty", &[("range", "bytes=-5")]).await;
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap().is_empty());
    assert_eq!(get(&s, "empty", &[("range", "bytes=0-")]).await.status(), 416);
}

#[tokio::test]
async fn a_method_not_allowed_names_the_ones_that_are() {
    let s = Server::start(&[]);
    put_new(&s, "k", b"x").await;
    let r = send(Method::POST, &s.object_url(B, "k"), &[], Some(b"x")).await;
    assert_eq!((r.status().as_u16(), header(&r, "allow")), (405, "GET, HEAD, PUT, DELETE".to_string()));
    let r = call(Method::GET, &format!("{}/_/batch/get", s.url)).await;
    assert_eq!((r.status().as_u16(), header(&r, "allow")), (405, "POST".to_string()));
    let r = call(Method::POST, &format!("{}/_/ui/app.js", s.url)).await;
    assert_eq!((r.status().as_u16(), header(&r, "allow")), (405, "GET, HEAD".to_string()));
    // A name the UI does not have is not there for any method.
    assert_eq!(call(Method::POST, &format!("{}/_/ui/nothing", s.url)).await.status(), 404);
}

#[tokio::test]
async fn content_type_is_stored_or_guessed_from_the_extension() {
    let s = Server::start(&[]);
    let custom = [("content-type", "application/x-custom")];
    assert_eq!(put(&s, "custom.txt", b"x", &custom).await.status(), 201);
    for (key, want) in [
        ("custom.txt", "application/x-custom"),
        ("notes.txt", "text/plain"),
        ("pic.png", "image/png"),
        ("no-extension", "application/octet-stream"),
    ] {
        if key != "custom.txt" {
            put_new(&s, key, b"x").await;
        }
        let ct = header(&get(&s, key, &[]).await, "content-type");
        assert!(ct.starts_with(want), "{key}: {ct}");
    }
    // An empty Content-Type is no media type: the extension's is used.
    assert_eq!(put(&s, "empty-type.txt", b"x", &[("content-type", "")]).await.status(), 201);
    assert!(header(&get(&s, "empty-type.txt", &[]).await, "content-type").starts_with("text/plain"));
}

// ----- deduplication -----

#[tokio::test]
async fn put_of_stored_bytes_is_deduplicated() {
    let s = Server::start(&[]);
    let (body, other) = (pattern(4096, 14), pattern(4096, 15));
    assert_eq!(put_new(&s, "first", &body).await["deduplicated"], false);
    assert_eq!(put_new(&s, "second", &body).await["deduplicated"], true);
    assert_eq!(put_new(&s, "third", &other).await["deduplicated"], false);
}

#[tokio::test]
async fn concurrent_puts_of_the_same_bytes_store_one_blob() {
    let s = Server::start(&[]);
    let body = pattern(64 * 1024, 16);
    let keys: Vec<String> = (0..20).map(|i| format!("same/{i}")).collect();
    let before = metrics(&s).await;

    let puts = keys.iter().map(|k| put(&s, k, &body, &[]));
    for r in futures::future::join_all(puts).await {
        assert_eq!(r.status(), 201);
    }
    let after = metrics(&s).await;
    assert_eq!(gauge(&after, "depot_blobs") - gauge(&before, "depot_blobs"), 1);
    assert_eq!(gauge(&after, "depot_objects") - gauge(&before, "depot_objects"), 20);
    for k in &keys {
        assert_eq!(read(&s, k).await, body, "{k}");
    }

    for k in &keys {
        assert_eq!(delete(&s, k).await.status(), 204);
    }
    for k in &keys {
        assert_absent(&s, k).await;
    }
    let objects = gauge(&metrics(&s).await, "depot_objects");
    assert_eq!(objects, gauge(&before, "depot_objects"));
}

// ----- bad input -----

#[tokio::test]
async fn invalid_bucket_names_are_400() {
    let s = Server::start(&[]);
    let object = format!("{}/Bad_Bucket/x", s.url);
    let bucket = format!("{}/Bad_Bucket", s.url);
    let upload = send(Method::PUT, &object, &[], Some(b"x")).await;
    for r in [call(Method::GET, &object).await, upload, call(Method::PUT, &bucket).await] {
        expect_error(r, 400, "InvalidBucketName").await;
    }
    assert_healthy(&s).await;
}

#[tokio::test]
async fn keys_over_1024_bytes_or_with_nul_are_400() {
    let s = Server::start(&[]);
    assert_eq!(put(&s, &"k".repeat(1024), b"x", &[]).await.status(), 201);
    let long = "k".repeat(1025);
    expect_error(put(&s, &long, b"x", &[]).await, 400, "InvalidKey").await;
    let nul = format!("{}/{B}/a%00b", s.url);
    let upload = send(Method::PUT, &nul, &[], Some(b"x")).await;
    for r in [upload, call(Method::GET, &nul).await] {
        expect_error(r, 400, "InvalidKey").await;
    }
    assert_healthy(&s).await;
}

#[tokio::test]
async fn unknown_methods_are_405() {
    let s = Server::start(&[]);
    put_new(&s, "x", b"x").await;
    let r = send(Method::PATCH, &s.object_url(B, "x"), &[], Some(b"y")).await;
    assert!(header(&r, "allow").contains("GET"));
    expect_error(r, 405, "MethodNotAllowed").await;
    assert_eq!(read(&s, "x").await, b"x");
    assert_healthy(&s).await;
}

#[tokio::test]
async fn oversized_headers_are_431() {
    let s = Server::start(&[]);
    let big = "a".repeat(100 * 1024);
    assert_eq!(raw(&s, "GET", "/_/health", &[("X-Big", &big)], b"").status, 431);
    assert_healthy(&s).await;
}

#[tokio::test]
async fn a_refusal_before_100_continue_closes_the_connection() {
    // The client waits for 100 Continue before sending its body; refused
    // first, it sends the next request instead, which must not be read as
    // the body of the first.
    let s = Server::start(&[]);
    let refused = "PUT /Not_A_Bucket/k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
    let next = "GET /_/health HTTP/1.1\r\nHost: x\r\n\r\n";
    let answer = common::raw(&s.addr, format!("{refused}{next}").as_bytes(), Duration::from_secs(1));
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "one answer, then the connection closes: {answer}");
    assert_eq!(common::status_of(&answer), 400, "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert_healthy(&s).await;
}

/// A refusal that leaves no body unread keeps the connection, though the
/// request asked for 100 Continue: one with no body, and one whose body
/// the client sent without waiting and the server read to its end.
#[tokio::test]
async fn a_refusal_of_a_request_with_nothing_left_unread_keeps_the_connection() {
    let s = Server::start(&[]);
    put(&s, "k", b"hello", &[]).await;
    let no_body = "GET /files/k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nRange: bytes=100-\r\n\r\n";
    let wrong = sha256_hex(b"another body");
    let read = format!(
        "PUT /files/d HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nX-Depot-Sha256: {wrong}\r\n\
         Content-Length: 5\r\n\r\nhello"
    );
    let next = "GET /_/health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (first, status) in [(no_body.to_string(), 416), (read, 400)] {
        let answer = common::raw(&s.addr, format!("{first}{next}").as_bytes(), Duration::from_secs(1));
        let answer = answer.trim_start_matches("HTTP/1.1 100 Continue\r\n\r\n");
        assert_eq!(common::status_of(answer), status, "{answer}");
        assert!(answer.contains("HTTP/1.1 200 OK"), "the next request was answered: {answer}");
        assert!(!answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    }
    assert_absent(&s, "d").await;
}

#[tokio::test]
async fn body_shorter_than_its_content_length_is_400_and_stores_nothing() {
    let s = Server::start(&[]);
    let head = [("Content-Length", "100")];
    let request = raw_request("PUT", "/files/short", &head, &[b'x'; 50]);
    let r = raw_exchange(&s.addr, &request, true);
    assert_eq!((r.status, &r.json()["error"]), (400, &json!("IncompleteBody")));
    assert_absent(&s, "short").await;
    assert_healthy(&s).await;
}

#[tokio::test]
async fn declared_sha256_must_match_and_be_well_formed() {
    let s = Server::start(&[]);
    let body = b"the real body";
    let wrong = sha256_hex(b"another body");
    let r = put(&s, "d", body, &[("x-depot-sha256", &wrong)]).await;
    expect_error(r, 400, "BadDigest").await;
    assert_absent(&s, "d").await;
    for bad in ["xyz", &wrong[..60]] {
        let r = put(&s, "d", body, &[("x-depot-sha256", bad)]).await;
        expect_error(r, 400, "InvalidRequest").await;
        assert_absent(&s, "d").await;
    }
    let right = sha256_hex(body);
    let r = put(&s, "d", body, &[("x-depot-sha256", &right)]).await;
    assert_eq!(r.status(), 201);
    assert_healthy(&s).await;
}

#[tokio::test]
async fn a_declared_modification_time_is_kept_and_a_bad_one_refused() {
    let s = Server::start(&[]);
    for bad in ["yesterday", "Sun, 32 Nov 2026 00:00:00 GMT", ""] {
        let r = put(&s, "m", b"body", &[("x-depot-modified", bad)]).await;
        expect_error(r, 400, "InvalidRequest").await;
        assert_absent(&s, "m").await;
    }
    for when in ["Sun, 13 Sep 2020 12:26:40 GMT", "Thu, 01 Jan 1970 00:00:00 GMT"] {
        let r = put(&s, "m", b"body", &[("x-depot-modified", when)]).await;
        assert!(r.status().is_success());
        assert_eq!(header(&get(&s, "m", &[]).await, "last-modified"), when);
        let r = get(&s, "m", &[("if-modified-since", when)]).await;
        assert_eq!(r.status(), 304, "conditionals use the kept time");
    }
    // A date to come is now (RFC 9110 section 8.8.2.1): kept as given, a
    // client revalidating with it would get 304 whatever replaced it.
    let future = "Sun, 01 Jan 2040 00:00:00 GMT";
    let r = put(&s, "m", b"first", &[("x-depot-modified", future)]).await;
    assert!(r.status().is_success());
    let r = get(&s, "m", &[]).await;
    let modified = httpdate::parse_http_date(&header(&r, "last-modified")).unwrap();
    assert!(modified <= httpdate::parse_http_date(&header(&r, "date")).unwrap(), "{modified:?}");
    assert_healthy(&s).await;
}

/// A key ending in `/` is a folder, which a GET lists: it takes an empty
/// marker and nothing else, which no GET could give back.
#[tokio::test]
async fn a_folder_takes_an_empty_marker_only() {
    let s = Server::start(&[]);
    let r = put(&s, "docs/", b"bytes", &[]).await;
    expect_error(r, 400, "InvalidRequest").await;
    assert_eq!(list(&s, "docs/", "").await["entries"], json!([]));
    // Nor through a batch put, where it used to be stored.
    let batch = client().post(format!("{}/_/batch/put?bucket={B}", s.url)).body("docs/\n5\nbytes\n").send();
    let refused = error_body(batch.await.unwrap(), 400).await;
    assert!(refused["message"].as_str().is_some_and(|m| m.contains("makes it a folder")), "{refused}");
    assert_eq!(list(&s, "docs/", "").await["entries"], json!([]));
    // Sent chunked, as a stream of nothing, it is empty too.
    let chunked = |bytes: &'static [u8]| {
        let stream = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(bytes))]);
        client().put(s.object_url(B, "docs/")).body(reqwest::Body::wrap_stream(stream)).send()
    };
    let refused = error_body(chunked(b"more bytes").await.unwrap(), 400).await;
    assert!(refused["message"].as_str().is_some_and(|m| m.contains("makes it a folder")), "{refused}");
    assert_eq!(chunked(b"").await.unwrap().status(), 201);
    assert_eq!(put(&s, "docs/", b"", &[]).await.status(), 200);
    let entries = list(&s, "docs/", "").await["entries"].clone();
    assert_eq!(entries.as_array().map(|e| e.len()), Some(1), "{entries}");
    assert_eq!((entries[0]["key"].as_str(), entries[0]["size"].as_u64()), (Some("docs/"), Some(0)));
}

#[tokio::test]
async fn a_digest_given_twice_differently_is_refused() {
    let s = Server::start(&[]);
    let body = b"declared twice";
    let (right, wrong) = (sha256_hex(body), sha256_hex(b"other"));
    for pair in [[&right, &wrong], [&wrong, &right]] {
        let r = put(&s, "d", body, &[("x-depot-sha256", pair[0]), ("x-depot-sha256", pair[1])]).await;
        expect_error(r, 400, "InvalidRequest").await;
        assert_absent(&s, "d").await;
    }
    let md5 = |b: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(hex::decode(md5_hex(b)).unwrap())
    };
    let r = put(&s, "d", body, &[("content-md5", &md5(body)), ("content-md5", &md5(b"other"))]).await;
    expect_error(r, 400, "InvalidRequest").await;
    assert_absent(&s, "d").await;
    let r = put(&s, "d", body, &[("x-depot-sha256", &right), ("x-depot-sha256", &right)]).await;
    assert_eq!(r.status(), 201, "the same value twice is one declaration");
    assert_healthy(&s).await;
}

/// Whether a file name in the data directory is one the store makes: a
/// blob named by its digest, the engine marker, or a RocksDB file.
fn is_store_file(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
        || ["CURRENT", "IDENTITY", "LOCK", "LOG", "ENGINE", "local-token"].contains(&name)
        || name.strip_prefix("LOG.old.").is_some_and(digits)
        || name.strip_prefix("MANIFEST-").is_some_and(digits)
        || name.strip_prefix("OPTIONS-").is_some_and(digits)
        || name.strip_suffix(".sst").is_some_and(digits)
        || name.strip_suffix(".log").is_some_and(digits)
}

/// What a key used as a path would have touched outside the data
/// directory: the files beside it, and `etc/passwd` next to it and one
/// level up.
fn outside_of(data: &Path) -> (BTreeSet<PathBuf>, Vec<bool>) {
    let mut beside = files_under(data.parent().unwrap());
    beside.retain(|p| !p.starts_with(data));
    let passwd = |a: &Path| a.join("etc/passwd").exists();
    let ancestors = data.ancestors().skip(1).take(2);
    (beside.into_iter().collect(), ancestors.map(passwd).collect())
}

#[tokio::test]
async fn hostile_keys_are_plain_keys_and_never_paths() {
    // The fs engine keeps every blob as a file: the engine where a key
    // turned into a path would show.
    let s = Server::start(&["--engine", "fs"]);
    let before = outside_of(&s.data);

    // (path as sent, key it names); dot segments go out unnormalised.
    let mut cases =
        vec![("/files/../../etc/passwd".to_string(), "../../etc/passwd"), ("/files/%2e%2e/x".to_string(), "../x")];
    for key in ["a//b", "emoji 🦀.txt", "back\\slash", "with  spaces ", "%2e%2e/y"] {
        cases.push((format!("/files/{}", encode_all(key)), key));
    }
    for (path, key) in &cases {
        let r = raw(&s, "PUT", path, &[], key.as_bytes());
        assert_eq!((r.status, &r.json()["key"]), (201, &json!(key)), "PUT {path}");
    }
    for (_, key) in &cases {
        let path = format!("/files/{}", encode_all(key));
        let r = raw(&s, "GET", &path, &[], b"");
        assert_eq!((r.status, &*r.body), (200, key.as_bytes()), "GET {path}");
        let digest = sha256_hex(key.as_bytes());
        assert_eq!(r.header("x-depot-sha256"), Some(&*digest));
    }
    let json_accept = [("Accept", "application/json")];
    let listing = raw(&s, "GET", "/files/%2E%2E/%2E%2E/etc/", &json_accept, b"");
    assert_eq!(keys_of(&listing.json()), ["../../etc/passwd"]);

    assert_eq!(outside_of(&s.data), before, "nothing written outside the data dir");
    let files = files_under(&s.data);
    let blobs = files.iter().filter(|p| p.starts_with(s.data.join("fs/blobs")));
    assert_eq!(blobs.count(), cases.len(), "one blob file per distinct body");
    for file in &files {
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(is_store_file(name), "unexpected file {}", file.display());
    }
    assert_healthy(&s).await;
}
