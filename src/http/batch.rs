//! Batch routes, for many small objects in one round trip.
//!
//! - `POST /_/batch/get?bucket=B`: keys, one per line. The answer gives,
//!   in request order, `<length>\n<bytes>\n` per key, or `-1\n` when absent.
//! - `POST /_/batch/put?bucket=B`: `<key>\n<length>\n<bytes>\n` repeated;
//!   every entry is stored, or none.
//! - `POST /_/batch/delete?bucket=B`: keys, one per line.

use std::fmt::Write;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{StatusCode, header};
use http_body_util::BodyExt;
use serde_json::json;
use tracing::Instrument;

use super::error::ApiError;
use super::native::{query, query_value, read_body};
use super::{App, Request, Response, json};
use crate::catalog::BlobRecord;
use crate::store::{Found, StoreError};

/// Most keys looked up in one catalog round.
const WINDOW: usize = 4096;
/// Fewest keys in a window, when a batch is split to be looked up on
/// several threads. A thousand keys in eight windows of 128 took 3.0–3.6
/// ms warm, against 3.2–3.7 in four of 256 and 3.4–3.5 in sixteen of 64
/// (medians of 100 batches, alternating runs): smaller windows share the
/// cores more evenly, and the answer starts on the first while the last
/// are still looked up.
const MIN_WINDOW: usize = 128;
/// Windows looked up at once. The lookups run on the blocking pool, so
/// every core takes a share of one batch, and more of them than cores
/// keep the disk busy when the catalog's pages are not in memory: a
/// lookup that faults waits for its page while the others go on
/// (a cold 100,000-key batch: 1.80× of `multi_get` with 3 in flight,
/// 1.30× with 8).
const LOOKAHEAD: usize = 8;
/// Objects up to this size are read together, [`READ_AT_ONCE`] at a time.
const SMALL: u64 = 64 * 1024;
/// Most bytes of small objects read in one engine call, and read ahead by
/// each window in flight: a window of 4,096 keys of 64 KiB objects would
/// otherwise hold 256 MiB, and the windows read ahead eight times that.
const READ_AT_ONCE: u64 = 4 << 20;
/// Bytes gathered before a piece of the answer is sent.
const SEND_AT: usize = 64 * 1024;

fn bucket_param(req: &Request) -> Result<String, ApiError> {
    query_value(&query(req), "bucket")
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad_request("the batch routes need ?bucket=NAME"))
}

/// The bucket of a batch that writes. A condition on the request would
/// be one for every entry, which the batch routes do not check: refused,
/// not ignored (an `If-None-Match: *` would otherwise overwrite). So is a
/// digest of the body, which no entry could be checked against.
fn written_bucket(req: &Request) -> Result<String, ApiError> {
    let conditions = [header::IF_MATCH, header::IF_NONE_MATCH, header::IF_UNMODIFIED_SINCE, header::IF_MODIFIED_SINCE];
    if let Some(name) = conditions.iter().find(|h| req.headers().contains_key(*h)) {
        return Err(ApiError::bad_request(format!(
            "{name}: the batch routes take no conditions; write such keys one by one"
        )));
    }
    let digest = |name: &str| name == "content-md5" || name == "x-depot-sha256" || name.starts_with("x-amz-checksum-");
    if let Some(name) = req.headers().keys().map(|h| h.as_str()).find(|h| digest(h)) {
        return Err(ApiError::bad_request(format!(
            "{name}: the batch routes check no digest of their body; send each entry's with a PUT of its own"
        )));
    }
    bucket_param(req)
}

/// A line with nothing on it (`\r\n` counts as a line's end here too).
fn is_blank(line: &[u8]) -> bool {
    line.is_empty() || line == b"\r"
}

fn bad_body(message: String) -> ApiError {
    ApiError::bad_request(format!("batch body: {message}"))
}

/// Splits a body into keys: one per line, `\r\n` tolerated, blank lines
/// skipped. The keys are counted before any is copied, so a list of
/// many short lines costs no more memory than its body when refused.
pub(super) fn keys_of(body: &[u8], max: usize) -> Result<Vec<String>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| ApiError::bad_request("the key list is not UTF-8"))?;
    if text.contains('\0') {
        return Err(ApiError::bad_request("the key list holds a NUL character, which no key does"));
    }
    let keys = || text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).filter(|l| !l.is_empty());
    if keys().nth(max).is_some() {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "TooManyKeys",
            format!("more than {max} keys in one batch; send them in several"),
        ));
    }
    Ok(keys().map(str::to_string).collect())
}

pub(super) async fn get(app: &Arc<App>, req: Request) -> Result<Response, ApiError> {
    let bucket = bucket_param(&req)?;
    app.store.bucket(&bucket).await?;
    let body = read_body(req, app.limits.max_batch_keys_bytes).await?;
    let keys = keys_of(&body, app.limits.max_batch_entries)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let (started, first) = tokio::sync::oneshot::channel();
    let app = app.clone();
    tokio::spawn(
        async move {
            if let Err(e) = answer_gets(&app, &bucket, &keys, &tx, started).await {
                // The status is sent already: cut the answer short so the
                // client sees a truncated body rather than wrong data.
                tracing::error!("batch get failed midway: {e}");
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
            }
        }
        .in_current_span(),
    );
    // The status waits for the first window: a catalog or an engine that
    // fails it is answered as a GET would be, not as a 200 cut short.
    first.await.map_err(|_| ApiError::from(StoreError::Internal("the batch's reader stopped".into())))??;
    let stream = crate::engine::channel_stream(rx);
    let body = http_body_util::StreamBody::new(stream.map(|r| r.map(hyper::body::Frame::data)));
    let mut r = http::Response::new(body.boxed_unsync());
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/octet-stream"));
    Ok(r)
}

/// Keys per window for a batch of `keys`: large enough that a lookup
/// amortises its trip to the blocking pool, small enough that even a
/// batch of a thousand keys is shared among the lookups in flight.
fn window_size(keys: usize) -> usize {
    let windows = keys.div_ceil(WINDOW).max(1).next_multiple_of(LOOKAHEAD);
    keys.div_ceil(windows).clamp(MIN_WINDOW, WINDOW)
}

async fn answer_gets(
    app: &App,
    bucket: &str,
    keys: &[String],
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    started: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
) -> Result<(), StoreError> {
    let mut started = Some(started);
    let mut out = BytesMut::with_capacity(SEND_AT * 2);
    let store = &app.store;
    // Small objects of a window come from the engine in a call or a few
    // (the first while the window is read ahead, the others as the answer
    // reaches them); larger ones stream one by one.
    let size = window_size(keys.len());
    let mut windows = futures::stream::iter((0..keys.len()).step_by(size))
        .map(|from| async move {
            let found = store.get_many(bucket, &keys[from..keys.len().min(from + size)]).await?;
            let ahead = store.read_small(within_budget(&mut small_blobs(&found).peekable())).await?;
            Ok::<_, StoreError>((found, ahead))
        })
        .buffered(LOOKAHEAD);
    while let Some(window) = windows.next().await {
        let (found, ahead) = match (window, started.take()) {
            (Ok(window), Some(started)) => {
                if started.send(Ok(())).is_err() {
                    return Ok(()); // the client went away
                }
                window
            }
            // Answered as the status.
            (Err(e), Some(started)) => {
                let _ = started.send(Err(e));
                return Ok(());
            }
            (window, None) => window?,
        };
        let mut left = small_blobs(&found).skip(ahead.len()).peekable();
        let mut small = ahead.into_iter();
        for entry in found.entries() {
            let Some((record, blobs)) = entry else {
                out.extend_from_slice(b"-1\n");
                continue;
            };
            writeln!(out, "{}", record.size).map_err(|e| StoreError::Internal(e.to_string()))?;
            if let Some(body) = record.kept_body() {
                out.extend_from_slice(body);
            }
            for blob in blobs {
                if record.size <= SMALL {
                    if small.len() == 0 {
                        small = store.read_small(within_budget(&mut left)).await?.into_iter();
                    }
                    let bytes = small.next().ok_or_else(|| StoreError::Internal("a small blob went missing".into()))?;
                    out.extend_from_slice(&bytes);
                    continue;
                }
                let mut stream = app.store.read_blob(blob).await?;
                while let Some(chunk) = stream.next().await {
                    out.extend_from_slice(&chunk?);
                    if out.len() >= SEND_AT && tx.send(Ok(out.split().freeze())).await.is_err() {
                        return Ok(()); // the client went away
                    }
                }
            }
            out.extend_from_slice(b"\n");
            if out.len() >= SEND_AT && tx.send(Ok(out.split().freeze())).await.is_err() {
                return Ok(()); // the client went away
            }
        }
    }
    if let Some(started) = started {
        let _ = started.send(Ok(()));
    }
    if !out.is_empty() {
        // Whether or not the client is still there, the answer is done.
        let _ = tx.send(Ok(out.freeze())).await;
    }
    Ok(())
}

/// The blobs of a window's objects of [`SMALL`] size or less, in the
/// answer's order.
fn small_blobs(found: &Found) -> impl Iterator<Item = &BlobRecord> {
    found.entries().flatten().filter(|(r, _)| r.size <= SMALL).flat_map(|(_, b)| b)
}

/// The next of `blobs` up to [`READ_AT_ONCE`] bytes in all (one at least).
fn within_budget<'a>(blobs: &mut std::iter::Peekable<impl Iterator<Item = &'a BlobRecord>>) -> Vec<&'a BlobRecord> {
    let mut taken = Vec::new();
    let mut bytes = 0;
    while let Some(blob) = blobs.next_if(|b| taken.is_empty() || bytes + b.size <= READ_AT_ONCE) {
        bytes += blob.size;
        taken.push(blob);
    }
    taken
}

pub(super) async fn delete(app: &Arc<App>, req: Request) -> Result<Response, ApiError> {
    let bucket = written_bucket(&req)?;
    let body = read_body(req, app.limits.max_batch_keys_bytes).await?;
    // One transaction, as a batch put is: it holds its keys' locks, and
    // waits for them, from its first key to its commit.
    let most = app.limits.max_batch_entries.min(app.limits.max_batch_put_entries);
    let keys = keys_of(&body, most)?;
    let done = app.store.delete_many(&bucket, &keys).await?;
    let deleted = done.iter().filter(|d| **d).count();
    Ok(json(StatusCode::OK, &json!({ "bucket": bucket, "deleted": deleted, "missing": done.len() - deleted })))
}

pub(super) async fn put(app: &Arc<App>, req: Request) -> Result<Response, ApiError> {
    let bucket = written_bucket(&req)?;
    app.store.bucket(&bucket).await?;
    let mut batch = app.store.batch(&bucket)?;
    let mut body = Framed::new(req.into_body().into_data_stream());
    let read: Result<(), ApiError> = async {
        while let Some((key, len)) = body.entry(app.store.max_key_bytes()).await? {
            let most = app.limits.max_batch_put_entries;
            if batch.len() >= most {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "TooManyKeys",
                    format!("more than {most} entries in one batch put; send them in several"),
                ));
            }
            if key.ends_with('/') && len > 0 {
                return Err(super::native::folder_not_empty(&key));
            }
            batch.add(&key, len, body.take(len)).await?;
            body.end_of_entry(&key, len).await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = read {
        // All or nothing: the entries read so far are not kept.
        batch.abandon().await;
        return Err(e);
    }
    let stored = batch.commit().await?;
    Ok(json(StatusCode::OK, &json!({ "bucket": bucket, "stored": stored })))
}

/// Reads the `key\nlength\nbytes\n` framing from a body stream, holding
/// at most one network chunk at a time.
pub(super) struct Framed<S> {
    stream: S,
    buf: Bytes,
}

impl<S, E> Framed<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin + Send,
    E: std::fmt::Display,
{
    pub(super) fn new(stream: S) -> Self {
        Framed { stream, buf: Bytes::new() }
    }

    /// The key and length of the next entry, whose bytes follow (read
    /// them with [`Framed::take`], then call [`Framed::end_of_entry`]);
    /// `None` at the end of the body.
    pub(super) async fn entry(&mut self, max_key: usize) -> Result<Option<(String, u64)>, ApiError> {
        let Some(mut key) = self.line(max_key).await? else {
            return Ok(None);
        };
        // Blank lines may end the body, as batch get and delete allow.
        while is_blank(&key) {
            match self.line(max_key).await? {
                None => return Ok(None),
                Some(line) if is_blank(&line) => {}
                Some(_) => return Err(bad_body("a blank line where a key belongs".into())),
            }
            key = Vec::new();
        }
        let key = String::from_utf8(key).map_err(|_| bad_body("a key is not UTF-8".into()))?;
        if key.ends_with('\r') {
            // Batch get and delete take `\r\n` as a line's end, so they
            // could never name this key.
            return Err(bad_body(format!("the key {key:?} ends in \\r; store it with a plain PUT")));
        }
        let len_line =
            self.line(24).await?.ok_or_else(|| bad_body(format!("the body ends before the length of {key:?}")))?;
        // Digits alone: a sign, which the parser would take, is no length.
        let len: u64 = std::str::from_utf8(&len_line)
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad_body(format!("the length of {key:?} is not a number")))?;
        Ok(Some((key, len)))
    }

    /// Checks the newline that ends an entry's bytes.
    pub(super) async fn end_of_entry(&mut self, key: &str, len: u64) -> Result<(), ApiError> {
        if !self.newline().await? {
            return Err(bad_body(format!(
                "the {len} bytes of {key:?} are not followed by a newline: is the length right?"
            )));
        }
        Ok(())
    }

    /// Makes `buf` non-empty; false at the end of the body.
    async fn fill(&mut self) -> Result<bool, ApiError> {
        while self.buf.is_empty() {
            match self.stream.next().await {
                None => return Ok(false),
                Some(Err(e)) => return Err(StoreError::Body(e.to_string()).into()),
                Some(Ok(b)) => self.buf = b,
            }
        }
        Ok(true)
    }

    /// The next line without its `\n`, of at most `max` bytes; `None` at
    /// the end of the body when no byte of a line has come.
    async fn line(&mut self, max: usize) -> Result<Option<Vec<u8>>, ApiError> {
        let mut line = Vec::new();
        loop {
            if !self.fill().await? {
                return if line.is_empty() {
                    Ok(None)
                } else {
                    Err(ApiError::bad_request("batch body: the last line has no newline"))
                };
            }
            match self.buf.iter().position(|b| *b == b'\n') {
                Some(at) => {
                    line.extend_from_slice(&self.buf[..at]);
                    self.buf.advance(at + 1);
                    if line.len() > max {
                        return Err(ApiError::bad_request(format!("batch body: a line is longer than {max} bytes")));
                    }
                    return Ok(Some(line));
                }
                None => {
                    line.extend_from_slice(&self.buf);
                    self.buf.clear();
                    if line.len() > max {
                        return Err(ApiError::bad_request(format!("batch body: a line is longer than {max} bytes")));
                    }
                }
            }
        }
    }

    /// Consumes one `\n`; false if the next byte is something else.
    async fn newline(&mut self) -> Result<bool, ApiError> {
        if !self.fill().await? || self.buf[0] != b'\n' {
            return Ok(false);
        }
        self.buf.advance(1);
        Ok(true)
    }

    /// The next `n` bytes as a stream; it ends early (and the store then
    /// reports a short body) if the body does.
    pub(super) fn take(&mut self, n: u64) -> impl Stream<Item = Result<Bytes, ApiError>> + Send + Unpin + '_ {
        Box::pin(futures::stream::unfold((self, n), |(this, left)| async move {
            if left == 0 {
                return None;
            }
            match this.fill().await {
                Err(e) => Some((Err(e), (this, 0))),
                Ok(false) => None,
                Ok(true) => {
                    let k = (left as usize).min(this.buf.len());
                    let piece = this.buf.split_to(k);
                    Some((Ok(piece), (this, left - k as u64)))
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(pieces: &[&'static [u8]]) -> Framed<impl Stream<Item = Result<Bytes, String>> + Unpin + Send> {
        Framed::new(futures::stream::iter(pieces.iter().map(|p| Ok(Bytes::from_static(p))).collect::<Vec<_>>()))
    }

    #[tokio::test]
    async fn lines_and_bodies_cross_chunk_boundaries() {
        let mut f = framed(&[b"ke", b"y\n1", b"1\nhello", b" worl", b"d", b"\nx\n3\nabc!"]);
        assert_eq!(f.line(100).await.unwrap(), Some(b"key".to_vec()));
        assert_eq!(f.line(100).await.unwrap(), Some(b"11".to_vec()));
        let body: Vec<Bytes> = f.take(11).map(|r| r.unwrap()).collect().await;
        assert_eq!(body.concat(), b"hello world");
        assert!(f.newline().await.unwrap());
        assert_eq!(f.line(100).await.unwrap(), Some(b"x".to_vec()));
        assert_eq!(f.line(100).await.unwrap(), Some(b"3".to_vec()));
        let body: Vec<Bytes> = f.take(3).map(|r| r.unwrap()).collect().await;
        assert_eq!(body.concat(), b"abc");
        assert!(!f.newline().await.unwrap(), "a wrong length shows as a missing newline");
    }

    #[tokio::test]
    async fn long_lines_and_missing_newlines_are_errors() {
        let mut f = framed(&[b"abcdef\n"]);
        assert!(f.line(3).await.is_err());
        let mut f = framed(&[b"abc"]);
        assert!(f.line(10).await.is_err());
    }

    /// Batch get and delete read `key\r\n` as `key`, so batch put refuses
    /// keys they could not name.
    #[tokio::test]
    async fn keys_ending_in_a_carriage_return_are_refused() {
        let mut f = framed(&[b"key\r\n1\nx\n"]);
        let e = f.entry(100).await.unwrap_err();
        assert!(e.to_string().contains("ends in \\r"), "{e}");
        let mut f = framed(&[b"k\rey\n1\nx\n"]);
        assert_eq!(f.entry(100).await.unwrap(), Some(("k\rey".to_string(), 1)));
    }

    /// Blank lines may end a body (as an editor or `echo` leaves them);
    /// one before another entry is an error.
    #[tokio::test]
    async fn blank_lines_end_a_body_but_do_not_start_an_entry() {
        let mut f = framed(&[b"a\n1\nx\n\n\r\n", b"\n"]);
        assert_eq!(f.entry(100).await.unwrap(), Some(("a".to_string(), 1)));
        let body: Vec<Bytes> = f.take(1).map(|r| r.unwrap()).collect().await;
        assert_eq!(body.concat(), b"x");
        f.end_of_entry("a", 1).await.unwrap();
        assert_eq!(f.entry(100).await.unwrap(), None);
        let mut f = framed(&[b"\n\nb\n1\ny\n"]);
        let e = f.entry(100).await.unwrap_err();
        assert!(e.to_string().contains("a blank line where a key belongs"), "{e}");
    }

    #[test]
    fn small_objects_are_read_within_a_budget() {
        let blob = |size: u64| BlobRecord {
            digest: crate::engine::Digest([0; 32]),
            size,
            locator: Vec::new(),
            refs: 1,
            unreferenced_since: None,
        };
        let blobs = [blob(3 << 20), blob(1 << 20), blob(1), blob(READ_AT_ONCE + 1), blob(5)];
        let mut left = blobs.iter().peekable();
        let sizes = |taken: Vec<&BlobRecord>| taken.iter().map(|b| b.size).collect::<Vec<_>>();
        assert_eq!(sizes(within_budget(&mut left)), [3 << 20, 1 << 20], "up to the budget");
        assert_eq!(sizes(within_budget(&mut left)), [1]);
        assert_eq!(sizes(within_budget(&mut left)), [READ_AT_ONCE + 1], "one past it alone");
        assert_eq!(sizes(within_budget(&mut left)), [5]);
        assert!(within_budget(&mut left).is_empty());
    }

    #[test]
    fn batches_are_split_into_even_windows_for_every_lookup_in_flight() {
        let windows = |keys: usize| keys.div_ceil(window_size(keys));
        assert_eq!(windows(50), 1, "a small batch is one lookup");
        assert_eq!(windows(1000), 8, "a thousand keys: a window of 128 for every lookup in flight");
        assert_eq!(windows(LOOKAHEAD * MIN_WINDOW), LOOKAHEAD);
        assert_eq!(windows(100_000) % LOOKAHEAD, 0);
        for keys in [0, 1, 127, 128, 1000, 4096, 12_289, 100_000, 1_000_000] {
            assert!((MIN_WINDOW..=WINDOW).contains(&window_size(keys)), "{keys} keys");
        }
    }

    #[test]
    fn key_lists() {
        assert_eq!(keys_of(b"a\r\nb\n\nc", 10).unwrap(), ["a", "b", "c"]);
        assert_eq!(keys_of(b"a\nb\nc\n", 2).unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(keys_of(b"\xff\n", 10).is_err());
    }
}
