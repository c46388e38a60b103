//! The built-in load generator: a fixed number of workers, each with one
//! keep-alive HTTP/1.1 connection of its own, sending a request as soon as
//! the previous answer has been read in full. A warm-up period comes first
//! and is not measured; then several rounds of fixed length, each giving a
//! request rate, and the latency of every request measured. A request that
//! gets no 2xx answer is a failure: a run with failures is not reported as
//! a figure.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use super::stats::{Summary, percentile};

/// A request as the load generator sends it.
pub type Request = http::Request<Full<Bytes>>;

/// Builds a request for a target: the Host header is set (HTTP/1.1 needs
/// it; nginx refuses requests without it).
pub fn request(method: http::Method, addr: SocketAddr, path: &str, body: Bytes) -> Request {
    let mut req = http::Request::new(Full::new(body));
    *req.method_mut() = method;
    *req.uri_mut() = path.parse().unwrap_or_default();
    if let Ok(host) = http::HeaderValue::from_str(&addr.to_string()) {
        req.headers_mut().insert(http::header::HOST, host);
    }
    req
}

/// The length a request's answer must have, set on the request as an
/// extension: a 2xx of another length counts as a failure, not as a
/// request served.
#[derive(Clone, Copy, Debug)]
pub struct Expect(pub usize);

/// `req`, whose answer must be `len` bytes long.
pub fn expecting(mut req: Request, len: usize) -> Request {
    req.extensions_mut().insert(Expect(len));
    req
}

/// A new HTTP/1.1 connection to `addr` for bodies of type `B`, driven by
/// a task of its own.
pub async fn handshake<B>(addr: SocketAddr) -> anyhow::Result<SendRequest<B>>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, conn) = http1::handshake(connect(addr).await?).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn connect(addr: SocketAddr) -> anyhow::Result<TokioIo<tokio::net::TcpStream>> {
    let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(TokioIo::new(stream))
}

/// One keep-alive HTTP/1.1 connection, driven by the task that uses it:
/// an answer's bytes are read from the socket and taken by the same thread,
/// as `curl` or one of `wrk`'s threads does. (With the connection on a task
/// of its own, every frame of a body crossed to the waiting task on another
/// thread: a thread wake-up per frame, counted against the server.)
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
    conn: Option<http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>>,
}

impl Connection {
    pub async fn open(addr: SocketAddr) -> anyhow::Result<Connection> {
        let (sender, conn) = http1::handshake(connect(addr).await?).await?;
        Ok(Connection { sender, conn: Some(conn) })
    }

    /// Runs `work` on the connection's sender, polling the connection itself
    /// beside it (first, so that bytes it reads are taken in the same poll).
    /// Once the connection has ended, `work` meets the error.
    async fn drive<'a, F, T>(&'a mut self, work: impl FnOnce(&'a mut SendRequest<Full<Bytes>>) -> F) -> T
    where
        F: Future<Output = T> + 'a,
    {
        let conn = &mut self.conn;
        let mut work = std::pin::pin!(work(&mut self.sender));
        std::future::poll_fn(move |cx| {
            if let Some(c) = conn
                && Pin::new(c).poll(cx).is_ready()
            {
                *conn = None;
            }
            work.as_mut().poll(cx)
        })
        .await
    }

    /// Sends `req` and reads the whole answer.
    pub async fn send(&mut self, req: Request) -> anyhow::Result<(http::StatusCode, Bytes)> {
        self.drive(|sender| async move {
            sender.ready().await?;
            let resp = sender.send_request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok((status, body))
        })
        .await
    }

    /// Sends `req` and fails unless the answer is a 2xx, then hands the
    /// answer's body to `read`.
    async fn send_ok<T, F>(&mut self, req: Request, read: impl FnOnce(String, Incoming) -> F) -> anyhow::Result<T>
    where
        F: Future<Output = anyhow::Result<T>>,
    {
        let what = format!("{} {}", req.method(), req.uri());
        self.drive(|sender| async move {
            sender.ready().await.with_context(|| what.clone())?;
            let resp = sender.send_request(req).await.with_context(|| what.clone())?;
            let status = resp.status();
            if !status.is_success() {
                let text = resp.into_body().collect().await.with_context(|| what.clone())?.to_bytes();
                bail!("{what}: {status}: {}", String::from_utf8_lossy(&text[..text.len().min(300)]));
            }
            read(what, resp.into_body()).await
        })
        .await
    }

    /// Sends `req`, fails unless the answer is a 2xx, and counts the body's
    /// bytes as they come, keeping none: a download to nowhere, like
    /// `curl -o /dev/null`.
    pub async fn download(&mut self, req: Request) -> anyhow::Result<u64> {
        self.send_ok(req, |what, mut body| async move {
            let mut len = 0;
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.with_context(|| what.clone())?.into_data() {
                    len += data.len() as u64;
                }
            }
            Ok(len)
        })
        .await
    }

    /// Sends `req` and fails unless the answer is a 2xx.
    pub async fn expect_ok(&mut self, req: Request) -> anyhow::Result<Bytes> {
        self.send_ok(req, |what, body| async move { Ok(body.collect().await.with_context(|| what)?.to_bytes()) }).await
    }
}

/// How hard and how long to load a target.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub concurrency: usize,
    pub warmup: Duration,
    pub rounds: usize,
    pub round: Duration,
}

impl Plan {
    pub fn total(&self) -> Duration {
        self.warmup + self.round * self.rounds as u32
    }
}

/// What a load run measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Requests per second in each round.
    pub per_round: Vec<f64>,
    /// Latency of every measured request, in microseconds, ascending.
    pub latencies_us: Vec<u32>,
    /// Successful requests including the warm-up (what a write run leaves).
    pub ok_total: u64,
}

impl Outcome {
    pub fn rate(&self) -> Option<Summary> {
        Summary::of(&self.per_round)
    }

    /// Adds the rounds of a later run of the same case.
    pub fn extend(&mut self, later: Outcome) {
        self.per_round.extend(later.per_round);
        self.latencies_us.extend(later.latencies_us);
        self.latencies_us.sort_unstable();
        self.ok_total += later.ok_total;
    }

    /// A latency percentile in milliseconds.
    pub fn latency_ms(&self, p: f64) -> Option<f64> {
        percentile(&self.latencies_us, p).map(|us| f64::from(us) / 1000.0)
    }
}

/// Makes the `seq`-th request of worker `worker`.
pub type MakeRequest = Arc<dyn Fn(usize, u64) -> Request + Send + Sync>;

/// What one worker saw.
#[derive(Default)]
struct Tally {
    per_round: Vec<u64>,
    latencies_us: Vec<u32>,
    ok_total: u64,
    failures: u64,
    first_failure: Option<String>,
}

/// Loads `addr` by `plan` with the requests `make` builds.
pub async fn run(addr: SocketAddr, plan: Plan, make: MakeRequest) -> anyhow::Result<Outcome> {
    let start = Instant::now();
    let workers: Vec<_> =
        (0..plan.concurrency).map(|w| tokio::spawn(worker(addr, plan, start, w, make.clone()))).collect();
    let mut per_round = vec![0u64; plan.rounds];
    let mut latencies_us = Vec::new();
    let (mut ok_total, mut failures, mut first_failure) = (0, 0, None);
    for w in workers {
        let t = w.await?;
        for (sum, n) in per_round.iter_mut().zip(&t.per_round) {
            *sum += n;
        }
        latencies_us.extend(t.latencies_us);
        ok_total += t.ok_total;
        failures += t.failures;
        first_failure = first_failure.or(t.first_failure);
    }
    if failures > 0 {
        bail!("{failures} of {} requests failed (first: {})", failures + ok_total, first_failure.unwrap_or_default());
    }
    latencies_us.sort_unstable();
    let secs = plan.round.as_secs_f64();
    Ok(Outcome { per_round: per_round.iter().map(|n| *n as f64 / secs).collect(), latencies_us, ok_total })
}

async fn worker(addr: SocketAddr, plan: Plan, start: Instant, w: usize, make: MakeRequest) -> Tally {
    let end = start + plan.total();
    let measured_from = start + plan.warmup;
    let mut tally = Tally { per_round: vec![0; plan.rounds], ..Tally::default() };
    let fail = |tally: &mut Tally, why: String| {
        tally.failures += 1;
        tally.first_failure.get_or_insert(why);
    };
    let mut conn: Option<Connection> = None;
    let mut seq = 0u64;
    while Instant::now() < end {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Connection::open(addr).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    fail(&mut tally, format!("{e:#}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let req = make(w, seq);
        let expect = req.extensions().get::<Expect>().copied();
        seq += 1;
        let sent = Instant::now();
        let result = c.send(req).await;
        let done = Instant::now();
        match result {
            Ok((status, body)) if status.is_success() && expect.is_some_and(|e| body.len() != e.0) => {
                let wanted = expect.map_or(0, |e| e.0);
                fail(&mut tally, format!("{status} with {} bytes where {wanted} were asked for", body.len()))
            }
            Ok((status, _)) if status.is_success() => {
                tally.ok_total += 1;
                if done >= measured_from && done < end {
                    let round = ((done - measured_from).as_secs_f64() / plan.round.as_secs_f64()) as usize;
                    if let Some(n) = tally.per_round.get_mut(round) {
                        *n += 1;
                    }
                    tally.latencies_us.push(u32::try_from((done - sent).as_micros()).unwrap_or(u32::MAX));
                }
            }
            Ok((status, body)) => {
                fail(&mut tally, format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])))
            }
            Err(e) => {
                fail(&mut tally, format!("{e:#}"));
                conn = None;
            }
        }
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const BIG: usize = 3 << 20;

    /// A real HTTP/1.1 server on a free port: `/big` answers `BIG` bytes,
    /// anything else a 404. Counts the connections it accepted.
    async fn server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let answer = hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                    let (status, body) = match req.uri().path() {
                        "/big" => (200, vec![7u8; BIG]),
                        _ => (404, b"no such thing".to_vec()),
                    };
                    let mut resp = http::Response::new(Full::new(Bytes::from(body)));
                    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                    Ok::<_, std::convert::Infallible>(resp)
                });
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), answer));
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn one_connection_carries_request_after_request() {
        let (addr, accepted) = server().await;
        let mut c = Connection::open(addr).await.unwrap();
        for _ in 0..3 {
            let len = c.download(request(http::Method::GET, addr, "/big", Bytes::new())).await.unwrap();
            assert_eq!(len, BIG as u64);
        }
        let (status, body) = c.send(request(http::Method::GET, addr, "/big", Bytes::new())).await.unwrap();
        assert_eq!((status, body.len()), (http::StatusCode::OK, BIG));
        let err = c.expect_ok(request(http::Method::GET, addr, "/nothing", Bytes::new())).await.unwrap_err();
        assert!(format!("{err:#}").contains("404 Not Found: no such thing"), "{err:#}");
        assert_eq!(c.expect_ok(request(http::Method::GET, addr, "/big", Bytes::new())).await.unwrap().len(), BIG);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// An answer of another length than the one asked for is a failure of
    /// the run, not a request served.
    #[tokio::test]
    async fn an_answer_of_the_wrong_length_fails_the_run() {
        let (addr, _) = server().await;
        let plan = Plan { concurrency: 2, warmup: Duration::ZERO, rounds: 1, round: Duration::from_millis(200) };
        let make = |len: usize| -> MakeRequest {
            Arc::new(move |_, _| expecting(request(http::Method::GET, addr, "/big", Bytes::new()), len))
        };
        assert!(run(addr, plan, make(BIG)).await.unwrap().ok_total > 0);
        let e = run(addr, plan, make(BIG - 1)).await.unwrap_err();
        assert!(
            format!("{e:#}").contains(&format!("200 OK with {BIG} bytes where {} were asked for", BIG - 1)),
            "{e:#}"
        );
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_an_error_not_a_wait() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let closer = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            drop(stream);
        });
        let mut c = Connection::open(addr).await.unwrap();
        closer.await.unwrap();
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            c.download(request(http::Method::GET, addr, "/big", Bytes::new())),
        );
        assert!(sent.await.expect("an answer, not a wait").is_err());
    }
}
