//! Hostile HTTP: malformed and abusive requests sent byte by byte over raw
//! TCP to the real server. Each must get the right 4xx or a closed
//! connection, never a panic, never unbounded memory, and never keep other
//! clients waiting: a watchdog thread asks for `/_/health` all along.
//! The limits involved are lowered by flags so the tests run in seconds.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Server, pattern, status_of};

// ----- helpers -----

/// What came back on one connection.
struct Answer {
    /// Everything read, all responses included.
    raw: Vec<u8>,
    /// Whether the server closed the connection (rather than went quiet).
    closed: bool,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// The first response's status; 0 when nothing came.
    fn status(&self) -> u16 {
        status_of(&self.text())
    }

    /// How many responses came.
    fn responses(&self) -> usize {
        self.text().matches("HTTP/1.1 ").count()
    }

    /// The first response's body (by its Content-Length).
    fn body(&self) -> Vec<u8> {
        let text = self.text().to_ascii_lowercase();
        let end = text.find("\r\n\r\n").expect("a response head") + 4;
        let len = text[..end]
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(self.raw.len() - end, |v| v.trim().parse().unwrap());
        self.raw[end..end + len].to_vec()
    }
}

fn connect(s: &Server) -> TcpStream {
    let c = TcpStream::connect(&s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

/// Reads until the server closes or is quiet for `quiet`.
fn read_all(mut c: TcpStream, quiet: Duration) -> Answer {
    c.set_read_timeout(Some(quiet)).unwrap();
    let (mut raw, mut buf) = (Vec::new(), [0u8; 65536]);
    loop {
        match c.read(&mut buf) {
            Ok(0) => return Answer { raw, closed: true },
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // A reset after the answer (the server closed with unread
            // input) is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Answer { raw, closed: true },
            Err(_) => return Answer { raw, closed: false },
        }
    }
}

/// Reads a whole answer 16 KiB at a time, pausing `pause` after each
/// read, until the server closes; an error on the way fails the test.
fn read_slowly(c: &mut TcpStream, pause: Duration, what: &str) -> Answer {
    let (mut raw, mut buf) = (Vec::new(), [0u8; 16384]);
    loop {
        match c.read(&mut buf) {
            Ok(0) => return Answer { raw, closed: true },
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => panic!("{what}: the answer broke off after {} bytes: {e}", raw.len()),
        }
        thread::sleep(pause);
    }
}

/// Sends `request` as is (write errors tolerated: the server may answer
/// and close before reading it all) and reads what comes back.
fn exchange(s: &Server, request: &[u8]) -> Answer {
    let mut c = connect(s);
    let _ = c.write_all(request);
    read_all(c, Duration::from_secs(5))
}

fn get(s: &Server, path: &str, extra: &str) -> Answer {
    exchange(s, format!("GET {path} HTTP/1.1\r\nHost: depot\r\nConnection: close\r\n{extra}\r\n").as_bytes())
}

/// One request with `body`, on a connection of its own.
fn send(s: &Server, method: &str, path: &str, body: &[u8]) -> Answer {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: depot\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    exchange(s, &[head.as_bytes(), body].concat())
}

fn put(s: &Server, path: &str, body: &[u8]) -> Answer {
    send(s, "PUT", path, body)
}

/// A request to `/_/batch/{route}` of the bucket `files`.
fn post_batch(s: &Server, route: &str, body: &str) -> Answer {
    send(s, "POST", &format!("/_/batch/{route}?bucket=files"), body.as_bytes())
}

fn assert_absent(s: &Server, path: &str) {
    assert_eq!(get(s, path, "").status(), 404, "{path} exists");
}

/// Asks for `/_/health` every 100 ms on new connections until dropped,
/// and fails if an answer takes more than two seconds or is not a 200:
/// the server must keep serving others while it is being attacked.
struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<(usize, Duration)>>,
}

impl Watchdog {
    fn start(s: &Server) -> Watchdog {
        let (addr, stop) = (s.addr.clone(), Arc::new(AtomicBool::new(false)));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let (mut checks, mut slowest) = (0, Duration::ZERO);
            while !flag.load(Ordering::Relaxed) {
                let started = Instant::now();
                let answer = common::raw(
                    &addr,
                    b"GET /_/health HTTP/1.1\r\nHost: depot\r\nConnection: close\r\n\r\n",
                    Duration::from_secs(2),
                );
                assert_eq!(status_of(&answer), 200, "a bystander was not served: {answer:?}");
                slowest = slowest.max(started.elapsed());
                checks += 1;
                thread::sleep(Duration::from_millis(100));
            }
            (checks, slowest)
        });
        Watchdog { stop, thread: Some(thread) }
    }

    /// Stops; asserts every check passed in time.
    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let (checks, slowest) = self.thread.take().unwrap().join().expect("the watchdog failed");
        assert!(checks > 0, "the watchdog never ran");
        assert!(slowest < Duration::from_secs(2), "a bystander waited {slowest:?}");
    }
}

/// The server is alive, answers, did not panic, and stayed under `mib`.
fn assert_unharmed(s: &mut Server, mib: u64) {
    assert!(s.alive(), "the server died");
    assert_eq!(get(s, "/_/health", "").status(), 200);
    s.assert_no_panic();
    let peak = s.peak_rss() >> 20;
    assert!(peak < mib, "peak RSS {peak} MiB (limit {mib} MiB)");
}

/// Peak RSS allowed in these tests, in MiB: a debug build idles near 50.
const RSS_MIB: u64 = 200;

// ----- request heads -----

#[test]
fn malformed_request_heads_get_400_and_a_closed_connection() {
    let mut s = Server::start(&[]);
    let dog = Watchdog::start(&s);
    let cases: &[(&str, &[u8])] = &[
        ("garbage request line", b"GARBAGE\r\n\r\n"),
        ("no version", b"GET /_/health\r\nHost: x\r\n\r\n"),
        ("unknown version", b"GET /_/health HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("two spaces", b"GET  /_/health HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("binary request line", b"\x00\x01\x02\xff\r\n\r\n"),
        ("invalid UTF-8 in the target", b"GET /files/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("header without colon", b"GET /_/health HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n"),
        ("space before colon", b"GET /_/health HTTP/1.1\r\nHost: x\r\nContent-Length : 0\r\n\r\n"),
        ("obsolete line folding", b"GET /_/health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"),
        ("NUL in a header value", b"GET /_/health HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
        (
            "two different lengths",
            b"PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nhello",
        ),
        ("length list", b"PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 5\r\n\r\nhello"),
        ("negative length", b"PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
        ("length past u64", b"PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
        ("length with a sign", b"PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello"),
        ("hex length", b"PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\nhello"),
        ("unknown transfer coding", b"PUT /files/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nhello"),
        ("chunked not last", b"PUT /files/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"),
        (
            "chunked twice",
            b"PUT /files/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        (
            "chunked on two lines",
            b"PUT /files/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\n",
        ),
        ("two Host headers", b"GET /_/health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
        ("no Host header", b"GET /_/health HTTP/1.1\r\n\r\n"),
    ];
    for (what, request) in cases {
        let a = exchange(&s, request);
        assert_eq!(a.status(), 400, "{what}: {}", a.text());
        assert!(a.closed, "{what}: the connection stays open after a 400");
    }
    assert_absent(&s, "/files/k");
    // Raw UTF-8 in a target is not valid URI syntax, but unambiguous:
    // taken as the key it spells, as nginx does.
    assert_eq!(put(&s, "/files/\u{e9}", b"e").status(), 201);
    assert_eq!(get(&s, "/files/%C3%A9", "").body(), b"e");
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

/// Any token is a method to HTTP: made-up ones are counted together, not
/// each kept for ever as a counter of its own.
#[test]
fn made_up_methods_are_counted_as_one() {
    let mut s = Server::start(&[]);
    let methods: Vec<String> = (0..200).map(|i| format!("MADEUP{i}{}", "X".repeat(1000))).collect();
    for method in &methods {
        let a = exchange(&s, format!("{method} /files/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
        assert!((400..500).contains(&a.status()) || a.status() == 501, "{}", a.text());
    }
    let metrics = String::from_utf8(get(&s, "/_/metrics", "").body()).unwrap();
    assert!(!metrics.contains("MADEUP"), "a made-up method became a counter");
    let other = metrics.lines().filter(|l| l.starts_with("depot_http_requests_total{method=\"other\""));
    assert_eq!(other.map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum::<u64>(), 200, "{metrics}");
    assert_unharmed(&mut s, RSS_MIB);
}

/// A connection that never sent a whole request head does not hold the
/// server's stop until its header timeout: it is closed at once, as one
/// idle between requests is.
#[test]
fn a_connection_that_never_asked_does_not_hold_the_stop() {
    let mut s = Server::start(&[]);
    let _silent = connect(&s);
    let mut started_a_head = connect(&s);
    started_a_head.write_all(b"GET /_/health HT").unwrap();
    // Accepted, and given to a thread, before the stop.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(get(&s, "/_/health", "").status(), 200);
    let started = std::time::Instant::now();
    assert!(s.stop().success());
    assert!(started.elapsed() < Duration::from_secs(10), "stopped after {:?}", started.elapsed());
}

/// The bytes received are the bytes read: a length a client declares and
/// never sends does not count (nor, past 2^63, turn the counter negative).
#[test]
fn received_bytes_count_what_came() {
    let mut s = Server::start(&["--access-key", "app", "--secret-key", "a-long-random-secret"]);
    let huge = "PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551613\r\nConnection: close\r\n\r\n";
    assert_eq!(exchange(&s, huge.as_bytes()).status(), 403);
    let metrics =
        String::from_utf8(get(&s, "/_/metrics", "Authorization: Bearer a-long-random-secret\r\n").body()).unwrap();
    let line = metrics.lines().find(|l| l.starts_with("depot_http_received_bytes_total ")).expect(&metrics);
    let received: i64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((0..1_000_000).contains(&received), "{line}");
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn oversized_or_too_many_headers_get_431_and_memory_stays_bounded() {
    let mut s = Server::start(&[]);
    let dog = Watchdog::start(&s);
    let many = |n: usize, line: &str| format!("GET /_/health HTTP/1.1\r\nHost: x\r\n{}\r\n", line.repeat(n));
    // Just inside the defaults (100 headers, 64 KiB) is served.
    assert_eq!(exchange(&s, many(98, "X-A: b\r\n").as_bytes()).status(), 200);
    assert_eq!(exchange(&s, many(101, "X-A: b\r\n").as_bytes()).status(), 431, "101 headers");
    assert_eq!(exchange(&s, many(5000, "X-A: b\r\n").as_bytes()).status(), 431, "5000 duplicated headers");
    let long_line = format!("X-Big: {}\r\n", "a".repeat(70 * 1024));
    assert_eq!(exchange(&s, many(1, &long_line).as_bytes()).status(), 431, "one 70 KiB header");
    // Many oversized heads, megabytes each: refused early, never buffered
    // whole (a closed connection without an answer is fine too).
    let huge = many(1, &format!("X-Huge: {}\r\n", "h".repeat(4 << 20)));
    for _ in 0..50 {
        let a = exchange(&s, huge.as_bytes());
        assert!(a.closed && [0, 431].contains(&a.status()), "{}", a.text());
    }
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn lowered_header_limits_are_enforced() {
    let mut s = Server::start(&["--max-headers", "10", "--max-header-bytes", "2048"]);
    let head = |extra: &str| format!("GET /_/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n");
    assert_eq!(exchange(&s, head(&"X-A: b\r\n".repeat(5)).as_bytes()).status(), 200);
    assert_eq!(exchange(&s, head(&"X-A: b\r\n".repeat(11)).as_bytes()).status(), 431, "11 headers");
    let big = format!("X-Big: {}\r\n", "a".repeat(3000));
    assert_eq!(exchange(&s, head(&big).as_bytes()).status(), 431, "a 3 KB head");
    assert_unharmed(&mut s, RSS_MIB);
}

// ----- bodies -----

#[test]
fn content_length_with_transfer_encoding_is_read_chunked_and_the_connection_closed() {
    // RFC 9112 section 6.3: Transfer-Encoding overrides Content-Length, and
    // the connection must close after the answer, so that a request hidden
    // behind the body (request smuggling) is never read.
    let mut s = Server::start(&[]);
    let smuggled = "GET /files/smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let request = format!(
        "PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
         5\r\nhello\r\n0\r\n\r\n{smuggled}"
    );
    let a = exchange(&s, request.as_bytes());
    assert_eq!((a.status(), a.responses()), (201, 1), "{}", a.text());
    assert!(a.closed, "the connection stays open");
    assert_eq!(get(&s, "/files/k", "").body(), b"hello");
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn a_transfer_coding_other_than_chunked_is_501_and_stores_nothing() {
    // RFC 9112 section 6.1: the server cannot undo gzip; the coded bytes
    // must not be stored as the body.
    let mut s = Server::start(&[]);
    let request =
        "PUT /files/te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    let a = exchange(&s, request.as_bytes());
    assert_eq!(a.status(), 501, "{}", a.text());
    assert!(a.closed, "the unread body could be read as a request");
    assert_absent(&s, "/files/te");
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn a_partial_put_is_400_and_stores_nothing() {
    // RFC 9110 section 9.3.4: Content-Range on a PUT is not the whole object.
    let s = Server::start(&[]);
    let a = exchange(
        &s,
        b"PUT /files/cr HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\nContent-Range: bytes 0-4/100\r\n\r\nhello",
    );
    assert_eq!(a.status(), 400, "{}", a.text());
    assert_absent(&s, "/files/cr");
}

/// A refusal sent before the body arrived says the connection closes: a
/// keep-alive client must not send its next request on it. A refusal after
/// the whole body was read keeps the connection.
#[test]
fn a_refusal_before_the_body_says_the_connection_closes() {
    let s = Server::start(&[]);
    // In the first answer's head.
    let has_close = |a: &Answer| {
        let text = a.text().to_ascii_lowercase();
        text[..text.find("\r\n\r\n").unwrap_or(text.len())].contains("\r\nconnection: close")
    };
    for early in [
        "PUT /nobucket/k HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n".to_string(),
        format!("PUT /files/{} HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n", "k".repeat(2000)),
        "PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\nContent-Range: bytes 0-9/20\r\n\r\n".to_string(),
    ] {
        let mut c = connect(&s);
        c.write_all(early.as_bytes()).unwrap();
        let a = read_all(c, Duration::from_secs(2));
        assert!(a.status() >= 400 && has_close(&a), "{early:?} was answered:\n{}", a.text());
    }
    // Read to its end, then refused: the connection carries the next request.
    let mut c = connect(&s);
    let refused =
        "PUT /files/md5 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-MD5: AAAAAAAAAAAAAAAAAAAAAA==\r\n\r\nhello";
    c.write_all(refused.as_bytes()).unwrap();
    c.write_all(b"GET /files/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let a = read_all(c, Duration::from_secs(5));
    assert_eq!(a.status(), 400, "{}", a.text());
    assert!(!has_close(&a), "{}", a.text());
    assert_eq!(a.responses(), 2, "the second request was not answered:\n{}", a.text());
}

/// A client that sends its whole body before it reads (as most do without
/// `Expect: 100-continue`) gets the refusal sent before the body came,
/// however late the body comes: the connection is closed gently, not reset
/// with the answer still unread on the client's side.
#[test]
fn a_refusal_reaches_a_client_that_sends_its_body_first() {
    let mut s = Server::start(&[]);
    for round in 0..5 {
        let mut c = connect(&s);
        c.write_all(b"PUT /Not_A_Bucket/k HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n").unwrap();
        // The answer is out, and the server done with the connection,
        // before the body comes.
        std::thread::sleep(Duration::from_millis(300));
        for piece in pattern(300_000, round).chunks(30_000) {
            c.write_all(piece).expect("the server reset the connection while the body was sent");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut raw = Vec::new();
        let read = c.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw);
        assert!(read.is_ok(), "round {round}: {read:?} after reading {text:?}");
        assert_eq!(status_of(&text), 400, "round {round}: {text}");
        assert!(text.contains("InvalidBucketName"), "round {round}: {text}");
    }
    assert_unharmed(&mut s, RSS_MIB);
}

/// A form upload made of a thousand empty parts, sent in small pieces, is
/// looked through for its file a bounded number of times: it is answered
/// at once, and the server is unharmed.
#[test]
fn a_form_of_many_empty_parts_costs_little() {
    let mut s = Server::start(&["--access-key", "app", "--secret-key", "a-long-random-secret"]);
    let form = "--B\r\n\r\n\r\n".repeat(1000) + "--B--\r\n";
    let head = format!(
        "POST /files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=B\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        form.len()
    );
    let mut c = connect(&s);
    c.write_all(head.as_bytes()).unwrap();
    let started = std::time::Instant::now();
    for piece in form.as_bytes().chunks(7) {
        if c.write_all(piece).is_err() {
            break;
        }
    }
    let a = read_all(c, Duration::from_secs(10));
    assert!((400..500).contains(&a.status()), "{}", a.text());
    assert!(started.elapsed() < Duration::from_secs(5), "answered after {:?}", started.elapsed());
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn a_request_sent_before_the_client_closes_its_side_is_answered() {
    // `nc -N` and others shut down writing once the request is out: the
    // answer must still come, and the outcome must not be left to chance.
    let s = Server::start(&[]);
    for i in 0..5 {
        let mut c = connect(&s);
        c.write_all(format!("PUT /files/hc{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello").as_bytes())
            .unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let a = read_all(c, Duration::from_secs(5));
        assert_eq!(a.status(), 201, "{}", a.text());
        assert_eq!(get(&s, &format!("/files/hc{i}"), "").body(), b"hello");
    }
}

#[test]
fn a_body_longer_than_declared_stores_only_the_declared_bytes() {
    let mut s = Server::start(&[]);
    let a = exchange(&s, b"PUT /files/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello, and more bytes\r\n\r\n");
    assert_eq!(a.status(), 201, "{}", a.text());
    // What follows the declared bytes is read as the next request: not
    // HTTP, so a 400 and a closed connection.
    assert_eq!(a.responses(), 2, "{}", a.text());
    assert!(a.text().contains("HTTP/1.1 400"), "{}", a.text());
    assert!(a.closed);
    assert_eq!(get(&s, "/files/k", "").body(), b"hello");
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn broken_chunked_bodies_are_400_and_store_nothing() {
    let mut s = Server::start(&[]);
    let dog = Watchdog::start(&s);
    let head = "PUT /files/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    let bodies: &[(&str, &str)] = &[
        ("size not hexadecimal", "zz\r\nhello\r\n0\r\n\r\n"),
        ("size past u64", "fffffffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
        ("negative size", "-5\r\nhello\r\n0\r\n\r\n"),
        ("data longer than its size", "3\r\nhello\r\n0\r\n\r\n"),
        ("no CRLF after the data", "5\r\nhelloX0\r\n\r\n"),
        ("bare LF in the size line", "5\nhello\r\n0\r\n\r\n"),
    ];
    for (what, body) in bodies {
        let a = exchange(&s, format!("{head}{body}").as_bytes());
        assert_eq!(a.status(), 400, "{what}: {}", a.text());
        assert!(a.closed, "{what}: the connection stays open");
    }
    // Cut off before the last chunk: the client half-closes.
    let mut c = connect(&s);
    c.write_all(format!("{head}5\r\nhello\r\n").as_bytes()).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let a = read_all(c, Duration::from_secs(5));
    assert_eq!(a.status(), 400, "cut-off chunked body: {}", a.text());
    assert_absent(&s, "/files/k");
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

// ----- ranges -----

#[test]
fn many_or_overlapping_ranges_never_amplify_the_answer() {
    // CVE-2011-3192 ("Apache killer"): `bytes=0-,0-,...` made servers send
    // an object once per range. More than --max-ranges gets a plain 200;
    // overlapping ranges are coalesced.
    let mut s = Server::start(&[]);
    let len = 100_000;
    let object = pattern(len, 7);
    assert_eq!(put(&s, "/files/obj", &object).status(), 201);
    let dog = Watchdog::start(&s);
    let ranged = |spec: &str| get(&s, "/files/obj", &format!("Range: bytes={spec}\r\n"));
    let list = |n: usize, f: &dyn Fn(usize) -> String| (0..n).map(f).collect::<Vec<_>>().join(",");

    let a = ranged(&list(5000, &|_| "0-".into()));
    assert_eq!((a.status(), a.body().len()), (200, len), "5000 ranges: the whole object, once");
    let a = ranged(&list(65, &|i| format!("{i}-{i}")));
    assert_eq!((a.status(), a.body()), (200, object.clone()), "65 ranges are over the default of 64");

    let a = ranged(&list(64, &|_| "0-".into()));
    assert_eq!((a.status(), a.body()), (206, object.clone()), "64 times the whole object: coalesced to one");
    assert!(a.text().contains(&format!("content-range: bytes 0-{}/{len}", len - 1)), "{}", a.text());
    let a = ranged(&list(60, &|i| format!("{}-{}", i * 10, i * 10 + 50_000)));
    assert_eq!(a.status(), 206);
    assert_eq!(a.body(), &object[..50_591], "60 overlapping windows: their union, once");
    let a = ranged("-10,0-9,5-14");
    let body = a.body();
    assert_eq!(a.status(), 206);
    assert!(body.len() < 25 + 400, "two parts (0-14 and the last 10 bytes), not three: {} bytes", body.len());
    assert!(a.text().contains("Content-Range: bytes 0-14/") && a.text().contains(&format!("bytes {}-", len - 10)));

    // Many small disjoint ranges, as many times as a client likes: each
    // answer costs at most the object plus part headers.
    for _ in 0..20 {
        let a = ranged(&list(64, &|i| format!("{}-{}", i * 1000, i * 1000 + 1)));
        assert_eq!(a.status(), 206);
        assert!(a.body().len() < 64 * 150, "{} bytes for 128 bytes of ranges", a.body().len());
    }
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn a_lowered_range_limit_is_enforced() {
    let mut s = Server::start(&["--max-ranges", "2"]);
    assert_eq!(put(&s, "/files/obj", &pattern(1000, 1)).status(), 201);
    let ranged = |spec: &str| get(&s, "/files/obj", &format!("Range: bytes={spec}\r\n"));
    let two = ranged("0-1,10-11");
    assert_eq!(two.status(), 206);
    assert!(two.text().contains("multipart/byteranges"));
    assert_eq!((ranged("0-1,10-11,20-21").status(), ranged("0-1,10-11,20-21").body().len()), (200, 1000));
    assert_unharmed(&mut s, RSS_MIB);
}

// ----- keys in URLs -----

#[test]
fn hostile_keys_in_the_url_are_refused_with_400() {
    let mut s = Server::start(&[]);
    let dog = Watchdog::start(&s);
    let cases: &[(&str, &str)] = &[
        ("/files/%FF%FE", "InvalidKey"),
        ("/files/a%C3", "InvalidKey"),
        ("/files/%ED%A0%80", "InvalidKey"),
        ("/files/%zz", "InvalidURI"),
        ("/files/a%2", "InvalidURI"),
        ("/files/100%", "InvalidURI"),
        ("/files/%00", "InvalidKey"),
        ("/files/a%00/../b", "InvalidKey"),
        ("/%FF/k", "InvalidKey"),
        ("/Files/k", "InvalidBucketName"),
        ("/fi%00es/k", "InvalidBucketName"),
    ];
    for (path, code) in cases {
        for a in [put(&s, path, b"x"), get(&s, path, "")] {
            assert_eq!(a.status(), 400, "{path}: {}", a.text());
            assert!(a.text().contains(code), "{path}: want {code}: {}", a.text());
        }
    }
    // A 60 KiB key fits in the head but not the key limit; a 100 KiB one
    // does not fit in the head.
    let long = format!("/files/{}", "k".repeat(60 * 1024));
    assert!(put(&s, &long, b"x").text().contains("InvalidKey"));
    let longer = format!("/files/{}", "k".repeat(100 * 1024));
    assert_eq!(put(&s, &longer, b"x").status(), 431);
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn a_lowered_key_limit_is_enforced_everywhere_keys_come_in() {
    let mut s = Server::start(&["--max-key-bytes", "16"]);
    assert_eq!(put(&s, &format!("/files/{}", "k".repeat(16)), b"x").status(), 201);
    let a = put(&s, &format!("/files/{}", "k".repeat(17)), b"x");
    assert!(a.status() == 400 && a.text().contains("at most 16"), "{}", a.text());
    let a = post_batch(&s, "put", &format!("{}\n1\nx\n", "b".repeat(17)));
    assert_eq!(a.status(), 400, "batch put with a long key: {}", a.text());
    let listing = get(&s, "/files/", "Accept: application/json\r\n");
    assert_eq!(listing.status(), 200);
    assert!(!listing.text().contains("bbbb"), "the batch stored its long key: {}", listing.text());
    assert_unharmed(&mut s, RSS_MIB);

    // Restarted with a lower limit: keys stored under the old one can
    // still be read and deleted, and no longer written.
    s.stop();
    let mut s = Server::start_in(&s.data, &["--max-key-bytes", "8"]);
    let long = format!("/files/{}", "k".repeat(16));
    assert_eq!(get(&s, &long, "").body(), b"x");
    assert_eq!(put(&s, &long, b"y").status(), 400);
    let a = exchange(&s, format!("DELETE {long} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
    assert_eq!(a.status(), 204, "{}", a.text());
    assert_absent(&s, &long);
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn lowered_batch_limits_are_enforced() {
    let mut s =
        Server::start(&["--max-batch-entries", "2", "--max-batch-put-entries", "2", "--max-batch-keys-bytes", "64"]);
    let post = |route: &str, body: &str| post_batch(&s, route, body);
    assert_eq!(post("put", "a\n1\nx\nb\n1\ny\n").status(), 200);
    let a = post("put", "c\n1\nx\nd\n1\ny\ne\n1\nz\n");
    assert!(a.status() == 413 && a.text().contains("TooManyKeys"), "{}", a.text());
    assert_absent(&s, "/files/c");
    assert_eq!(post("get", "a\nb\nc\n").status(), 413, "three keys");
    let a = post("delete", &"k".repeat(65));
    assert!(a.status() == 413 && a.text().contains("EntityTooLarge"), "{}", a.text());
    assert_eq!(get(&s, "/files/a", "").body(), b"x", "nothing deleted");
    assert_unharmed(&mut s, RSS_MIB);
}

/// A batch put is held in memory until it commits, so by default it may
/// have 10,000 entries, far fewer than a batch get may have keys; a batch
/// delete, one transaction as well, as many keys.
#[test]
fn a_batch_put_holds_ten_thousand_entries_at_most() {
    let mut s = Server::start(&[]);
    let post = |entries: usize| {
        let body: String = (0..entries).map(|i| format!("k{i}\n1\nx\n")).collect();
        post_batch(&s, "put", &body)
    };
    let a = post(10_001);
    assert!(a.status() == 413 && a.text().contains("more than 10000 entries"), "{}", a.text());
    assert_absent(&s, "/files/k0");
    let a = post(10_000);
    assert!(a.status() == 200 && a.text().contains(r#""stored":10000"#), "{}", a.text());
    assert_eq!(get(&s, "/files/k9999", "").body(), b"x");
    // A batch delete is one transaction too: as many keys at most.
    let keys = |n: usize| -> String { (0..n).map(|i| format!("k{i}\n")).collect() };
    let a = post_batch(&s, "delete", &keys(10_001));
    assert!(a.status() == 413 && a.text().contains("more than 10000 keys"), "{}", a.text());
    assert_eq!(get(&s, "/files/k0", "").body(), b"x", "nothing deleted");
    let a = post_batch(&s, "delete", &keys(10_000));
    assert!(a.status() == 200 && a.text().contains(r#""deleted":10000"#), "{}", a.text());
    assert_absent(&s, "/files/k9999");
    assert_unharmed(&mut s, RSS_MIB);
}

/// A key list of the most bytes allowed, all short lines: counted before
/// any key is copied, it is refused in the memory of its body (copied,
/// each line would have cost about 50 bytes more than its own two).
#[test]
fn a_key_list_of_many_short_lines_is_refused_in_the_memory_of_its_body() {
    let mut s = Server::start(&[]);
    let body = "a\n".repeat(16 * 1024 * 1024);
    for route in ["get", "delete"] {
        let a = post_batch(&s, route, &body);
        assert!(a.status() == 413 && a.text().contains("TooManyKeys"), "{}", a.text());
    }
    assert_unharmed(&mut s, RSS_MIB);
}

// ----- slow clients -----

/// Each open connection may hold a request head while it arrives: past
/// `--max-connections`, new ones wait to be accepted until one closes.
#[test]
fn connections_beyond_the_limit_wait_until_one_closes() {
    let mut s = Server::start(&["--max-connections", "3"]);
    let mut held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut c = connect(&s);
            c.write_all(b"GET /_/health HTTP/1.1\r\nX-Pad: ").unwrap();
            c
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let mut waiting = connect(&s);
    waiting.write_all(b"GET /_/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let early = read_all(waiting.try_clone().unwrap(), Duration::from_secs(1));
    assert!(early.raw.is_empty() && !early.closed, "answered beyond the limit: {}", early.text());
    drop(held.pop());
    let answer = read_all(waiting, Duration::from_secs(5));
    assert_eq!(answer.status(), 200, "{}", answer.text());
    assert_unharmed(&mut s, RSS_MIB);
}

/// A connection closed gently after a refusal, whose client may still be
/// sending, keeps its place among `--max-connections` until it is let go.
#[test]
fn lingering_connections_count_against_the_limit() {
    let mut s = Server::start(&["--max-connections", "2"]);
    let refused: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut c = connect(&s);
            c.write_all(b"PUT /missing/k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
                .unwrap();
            let mut head = [0; 12];
            c.read_exact(&mut head).unwrap();
            assert_eq!(&head[9..], b"404", "{}", String::from_utf8_lossy(&head));
            c
        })
        .collect();
    // Both sockets linger, reading what their clients still send.
    let mut waiting = connect(&s);
    waiting.write_all(b"GET /_/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let early = read_all(waiting.try_clone().unwrap(), Duration::from_millis(800));
    assert!(early.raw.is_empty() && !early.closed, "answered beyond the limit: {}", early.text());
    // Once their clients close, the lingers end and give their places back.
    drop(refused);
    let answer = read_all(waiting, Duration::from_secs(5));
    assert_eq!(answer.status(), 200, "{}", answer.text());
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn trickled_headers_are_cut_off_after_the_header_timeout() {
    let mut s = Server::start(&["--header-timeout", "2"]);
    let dog = Watchdog::start(&s);
    let started = Instant::now();
    let slow: Vec<_> = (0..20)
        .map(|i| {
            let mut c = connect(&s);
            thread::spawn(move || {
                c.write_all(b"GET /_/health HTTP/1.1\r\nHost: x\r\n").unwrap();
                // A header line every 300 ms, for up to 20 s.
                for n in 0..66 {
                    if c.write_all(format!("X-Slow-{i}-{n}: y\r\n").as_bytes()).is_err() {
                        break;
                    }
                    thread::sleep(Duration::from_millis(300));
                }
                (read_all(c, Duration::from_secs(1)), started.elapsed())
            })
        })
        .collect();
    for t in slow {
        let (a, after) = t.join().unwrap();
        assert_eq!(a.status(), 0, "a trickled head was answered: {}", a.text());
        assert!(a.closed, "not closed");
        assert!(after > Duration::from_millis(1500) && after < Duration::from_secs(6), "closed after {after:?}");
    }
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn a_stalled_or_trickled_body_gets_408_after_the_body_timeout_and_a_slow_one_completes() {
    let mut s = Server::start(&["--body-timeout", "2"]);
    let dog = Watchdog::start(&s);
    // Stalls after 3 of 100 bytes.
    let mut stalled = connect(&s);
    stalled.write_all(b"PUT /files/stalled HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc").unwrap();
    // A byte every 300 ms: never silent for 2 s, but far under 500 bytes
    // a second, so it would hold its upload slot for as long as it liked.
    let mut trickled = connect(&s);
    trickled.write_all(b"PUT /files/trickled HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n").unwrap();
    let trickled_answer = trickled.try_clone().unwrap();
    let trickler = thread::spawn(move || {
        for _ in 0..30 {
            thread::sleep(Duration::from_millis(300));
            if trickled.write_all(b"t").is_err() {
                break;
            }
        }
    });
    let trickled_at = Instant::now();
    let trickled_answer =
        thread::spawn(move || (read_all(trickled_answer, Duration::from_secs(10)), trickled_at.elapsed()));
    // 600 bytes every 500 ms, for 5 s in all: slow, but over 500 a second.
    let mut slow = connect(&s);
    let piece = [b's'; 600];
    slow.write_all(b"PUT /files/slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 6000\r\n\r\n")
        .unwrap();
    let started = Instant::now();
    let steady = thread::spawn(move || {
        for _ in 0..10 {
            thread::sleep(Duration::from_millis(500));
            slow.write_all(&piece).unwrap();
        }
        read_all(slow, Duration::from_secs(5))
    });
    let a = read_all(stalled, Duration::from_secs(10));
    let waited = started.elapsed();
    assert_eq!(a.status(), 408, "{}", a.text());
    assert!(a.text().contains("RequestTimeout") && a.closed, "{}", a.text());
    assert!(waited > Duration::from_millis(1500) && waited < Duration::from_secs(6), "408 after {waited:?}");
    let (a, after) = trickled_answer.join().unwrap();
    assert_eq!(a.status(), 408, "a trickled body: {}", a.text());
    assert!(a.text().contains("less than 1000 bytes"), "{}", a.text());
    assert!(after < Duration::from_secs(5), "408 after {after:?}, not while it trickled");
    trickler.join().unwrap();
    let a = steady.join().unwrap();
    assert_eq!(a.status(), 201, "a slow but steady body: {}", a.text());
    assert_absent(&s, "/files/stalled");
    assert_absent(&s, "/files/trickled");
    assert_eq!(get(&s, "/files/slow", "").body(), [b's'; 6000]);
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

/// A client that stops reading a download is let go after the send
/// timeout; one that reads slowly but steadily gets the whole answer.
#[test]
fn a_stalled_download_is_cut_off_after_the_send_timeout() {
    let mut s = Server::start(&["--send-timeout", "2"]);
    let size = 32 << 20;
    assert_eq!(put(&s, "/files/big", &vec![7u8; size]).status(), 201);
    let request = b"GET /files/big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let mut stalled = connect(&s);
    stalled.write_all(request).unwrap();
    let mut first = [0u8; 1024];
    stalled.read_exact(&mut first).unwrap();
    // More than the socket buffers hold is left unread for twice the
    // timeout: the server gives up and closes.
    thread::sleep(Duration::from_secs(4));
    let a = read_all(stalled, Duration::from_secs(10));
    assert!(a.closed, "the connection stayed open");
    assert!(a.raw.len() + first.len() < size, "the whole answer came after a stall: {} bytes", a.raw.len());
    // Reading 1 MiB a second never stalls for two seconds.
    let mut steady = connect(&s);
    steady.write_all(request).unwrap();
    let (mut got, mut buf) = (0, vec![0u8; 1 << 20]);
    while got < size {
        match steady.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => panic!("a steady reader lost its answer after {got} bytes: {e}"),
        }
        thread::sleep(Duration::from_millis(if got < 4 << 20 { 500 } else { 0 }));
    }
    assert!(got > size, "a steady reader got {got} bytes");
    assert_unharmed(&mut s, RSS_MIB);
}

/// A reader too slow to free room in the socket within the send timeout,
/// but taking bytes all the while, gets its whole answer: the timeout is
/// for a client that takes nothing.
#[test]
fn a_reader_slower_than_the_send_timeout_per_write_gets_its_whole_answer() {
    let mut s = Server::start(&["--send-timeout", "1"]);
    let body = pattern(600_000, 3);
    assert_eq!(put(&s, "/files/slowly", &body).status(), 201);
    // A small receive buffer, read 16 KiB at a time 8 times a second: about
    // 130 KB/s, so a write waits about a second for room each time.
    let c = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    c.set_recv_buffer_size(8192).unwrap();
    let addr: std::net::SocketAddr = s.addr.parse().unwrap();
    c.connect(&addr.into()).unwrap();
    let mut c = TcpStream::from(c);
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /files/slowly HTTP/1.1\r\nHost: depot\r\nConnection: close\r\n\r\n").unwrap();
    let a = read_slowly(&mut c, Duration::from_millis(125), "/files/slowly");
    assert_eq!(a.status(), 200);
    assert!(a.raw.ends_with(&body), "the answer was cut off after {} bytes", a.raw.len());
    assert_eq!(a.body(), body);
    assert_unharmed(&mut s, RSS_MIB);
}

/// A file's body, sent from the page cache, and a hot object's, sent from
/// memory, come whole and in order to a reader slow enough that each
/// `sendfile` or `writev` sends only part of what it was given.
#[test]
fn bodies_sent_from_the_page_cache_come_whole_to_a_slow_reader() {
    let mut s = Server::start(&[]);
    let file = pattern(3 << 20, 1);
    let hot = pattern(150_000, 2);
    assert_eq!(put(&s, "/files/file", &file).status(), 201);
    assert_eq!(put(&s, "/files/hot", &hot).status(), 201);
    for (path, body) in [("/files/file", &file), ("/files/hot", &hot)] {
        // The first read brings the bytes into the page cache, or the
        // store's memory; the next ones are sent from there.
        for round in 0..3 {
            let mut c = connect(&s);
            c.write_all(format!("GET {path} HTTP/1.1\r\nHost: depot\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
            let pause = if round > 0 { Duration::from_micros(300) } else { Duration::ZERO };
            let a = read_slowly(&mut c, pause, path);
            assert_eq!(a.status(), 200);
            assert!(a.body() == *body, "{path}, round {round}: the body differs");
        }
        let a = get(&s, path, "Range: bytes=70000-2999999\r\n");
        assert_eq!(a.status(), 206);
        assert!(a.body() == body[70_000..body.len().min(3_000_000)], "{path}: the range differs");
    }
    assert_unharmed(&mut s, RSS_MIB);
}

/// A blob file cut short on disk while its bytes are being sent ends the
/// answer early (the connection closes short of its Content-Length); the
/// server, which maps such files but never reads them through the mapping,
/// keeps serving.
#[test]
fn a_file_truncated_while_it_is_sent_cuts_the_answer_and_harms_nothing() {
    let mut s = Server::start(&[]);
    let size = 32 << 20;
    let body = pattern(size, 3);
    assert_eq!(put(&s, "/files/big", &body).status(), 201);
    assert!(get(&s, "/files/big", "").body() == body);
    let blob = common::files_under(&s.data)
        .into_iter()
        .find(|f| f.metadata().is_ok_and(|m| m.len() == size as u64))
        .expect("the blob's file");
    let mut c = connect(&s);
    c.write_all(b"GET /files/big HTTP/1.1\r\nHost: depot\r\nConnection: close\r\n\r\n").unwrap();
    let mut first = [0u8; 1024];
    c.read_exact(&mut first).unwrap();
    std::fs::OpenOptions::new().write(true).open(&blob).unwrap().set_len(100_000).unwrap();
    let rest = read_all(c, Duration::from_secs(10));
    assert!(rest.closed, "the connection stayed open");
    assert!(first.len() + rest.raw.len() < size, "a whole answer from a truncated file");
    assert!(first.starts_with(b"HTTP/1.1 200"));
    assert_unharmed(&mut s, RSS_MIB);
}

#[test]
fn a_thousand_idle_connections_neither_block_others_nor_stay_open() {
    let mut s = Server::start(&["--header-timeout", "2"]);
    let dog = Watchdog::start(&s);
    let idle: Vec<TcpStream> = (0..1000).map(|_| connect(&s)).collect();
    // Half of them send part of a head, then nothing.
    for c in idle.iter().step_by(2) {
        let mut c = c;
        c.write_all(b"GET /_/health HTTP/1.1\r\nHo").unwrap();
    }
    assert_eq!(get(&s, "/_/health", "").status(), 200, "served while 1000 connections idle");
    thread::sleep(Duration::from_secs(4));
    let mut open = 0;
    for mut c in idle {
        c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let timed_out =
            |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
        if c.read(&mut [0u8; 16]).is_err_and(|e| timed_out(&e)) {
            open += 1;
        }
    }
    assert_eq!(open, 0, "idle connections still open after the header timeout");
    dog.finish();
    assert_unharmed(&mut s, RSS_MIB);
}

// ----- concurrent uploads -----

#[test]
fn uploads_beyond_the_limit_get_503_with_retry_after() {
    let mut s = Server::start(&["--max-uploads", "2"]);
    // Two uploads in progress: head and half their bodies sent.
    let mut open: Vec<TcpStream> = (0..2)
        .map(|i| {
            let mut c = connect(&s);
            let head =
                format!("PUT /files/u{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10\r\n\r\n");
            c.write_all(head.as_bytes()).unwrap();
            c.write_all(b"01234").unwrap();
            c
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let a = put(&s, "/files/third", b"abc");
    assert_eq!(a.status(), 503, "{}", a.text());
    let text = a.text().to_ascii_lowercase();
    assert!(text.contains("retry-after: 1") && text.contains("slowdown"), "{}", a.text());
    // The S3 API says SlowDown its own way (an anonymous S3 request).
    let a = put(&s, "/files/third?acl", b"<x/>");
    assert_eq!(a.status(), 503, "{}", a.text());
    assert!(a.text().contains("<Code>SlowDown</Code>"), "{}", a.text());
    // Reads are not uploads.
    assert_eq!(get(&s, "/_/health", "").status(), 200);
    for (i, c) in open.iter_mut().enumerate() {
        c.write_all(b"56789").unwrap();
        let a = read_all(c.try_clone().unwrap(), Duration::from_secs(5));
        assert_eq!(a.status(), 201, "upload {i}: {}", a.text());
    }
    assert_eq!(put(&s, "/files/third", b"abc").status(), 201, "a permit is free again");
    assert_unharmed(&mut s, RSS_MIB);
}

/// Out of file descriptors (idle connections filling a hard limit that
/// cannot be raised), a write fails with 503 and nothing more: once the
/// connections close, writes go on. A directory that could not be opened
/// to sync it used to count as a failed sync, and every write after it
/// was refused until a restart.
#[test]
fn running_out_of_file_descriptors_fails_writes_only_while_it_lasts() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    /// Stops the server however the test ends.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 64 && exec {} serve --data {} --listen 127.0.0.1:0 --engine fs --gc-interval 0",
            common::BIN,
            data.display()
        ))
        .env("DEPOT_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let _server = Killed(child);
    let addr = loop {
        let line = log.next().expect("the server said where it listens").unwrap();
        if let Some(at) = line.find("listening on http://") {
            break line[at + 20..].split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || log.for_each(drop));
    let put = |c: &mut TcpStream, key: &str| {
        // Each body new, so each write makes the blob directories of its own.
        let request = format!("PUT /files/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{key}", key.len());
        c.write_all(request.as_bytes()).unwrap();
        let mut buf = [0u8; 4096];
        let n = c.read(&mut buf).unwrap();
        status_of(&String::from_utf8_lossy(&buf[..n]))
    };
    let mut writer = TcpStream::connect(&addr).unwrap();
    writer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(put(&mut writer, "before"), 201);
    let idle: Vec<TcpStream> = (0..80).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
    thread::sleep(Duration::from_millis(300));
    let refused = put(&mut writer, "a/while-out");
    assert_eq!(refused, 503, "out of descriptors");
    drop(idle);
    thread::sleep(Duration::from_millis(300));
    let mut writer = TcpStream::connect(&addr).unwrap();
    writer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(put(&mut writer, "a/after"), 201, "writes go on once descriptors are free");
}
