//! What a client may send, and for how long: the limits `depot serve` takes
//! as flags, the request body that gives up on a client gone quiet, and the
//! gate that bounds how many upload bodies stream in at once.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

/// Limits on what a client may send.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request head (request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// Most header fields in one request.
    pub max_headers: usize,
    /// Time allowed to send a request head; also how long an idle
    /// connection is kept waiting for its next request.
    pub header_timeout: Duration,
    /// Time a request body has to bring each [`MIN_BODY_RATE`]'s worth of
    /// bytes (or its end).
    pub body_timeout: Duration,
    /// Time a client has to take each [`MIN_BODY_RATE`]'s worth of an
    /// answer (or all it was given).
    pub send_timeout: Duration,
    /// Most ranges honoured in one Range header.
    pub max_ranges: usize,
    /// Most keys in one batch get or delete (a delete is held to
    /// `max_batch_put_entries` too).
    pub max_batch_entries: usize,
    /// Most entries in one batch put, and keys in one batch delete. Either
    /// is one transaction, which locks its keys until it commits; a batch
    /// put holds its records meanwhile too, about 2 KB each.
    pub max_batch_put_entries: usize,
    /// Largest list of keys sent to a batch route, in bytes.
    pub max_batch_keys_bytes: usize,
    /// Most request bodies (uploads) read at the same time; more get 503.
    pub max_uploads: usize,
    /// Most connections open at once; more wait in the listen queue.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_ranges: 64,
            max_batch_entries: 1_000_000,
            max_batch_put_entries: 10_000,
            max_batch_keys_bytes: 64 * 1024 * 1024,
            max_uploads: 1024,
            max_connections: 4096,
        }
    }
}

/// The slowest a request body may come, in bytes a second, averaged over
/// each `body_timeout`: Apache's `RequestReadTimeout` default. A client
/// that trickles a byte now and then would otherwise hold its upload slot
/// (one of `max_uploads`) for as long as it likes.
pub const MIN_BODY_RATE: u64 = 500;

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("{}", too_slow(*.0))]
    TooSlow(Duration),
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// The bytes of a body each `window` must bring.
fn least_in(window: Duration) -> u64 {
    MIN_BODY_RATE * window.as_secs().max(1)
}

/// What a body that came too slowly is told.
pub(crate) fn too_slow(window: Duration) -> String {
    format!("less than {} bytes of the request body came in {window:?}", least_in(window))
}

/// What became of a request's body, for the answer: one that timed out is
/// a 408 whatever the handler made of the failed read, and a refusal sent
/// before the body ended closes the connection.
#[derive(Clone, Default)]
pub(crate) struct BodyState(Arc<([AtomicBool; 2], AtomicU64)>);

impl BodyState {
    pub(crate) fn timed_out(&self) -> bool {
        self.0.0[0].load(Ordering::Relaxed)
    }

    /// Whether the body was read to its end.
    pub(crate) fn ended(&self) -> bool {
        self.0.0[1].load(Ordering::Relaxed)
    }

    /// The body's bytes read so far: what came, not what its head said.
    pub(crate) fn read(&self) -> u64 {
        self.0.1.load(Ordering::Relaxed)
    }
}

/// A request body that fails unless each `window` brings at least
/// [`MIN_BODY_RATE`] bytes a second of it, or its end: a client trickling
/// its body, or gone silent, does not hold a request forever. (tower-http's
/// `TimeoutBody` gives up on silence alone, and hides the size hint, which
/// the S3 layer reads as the body's length.)
pub struct RequestBody {
    inner: Incoming,
    window: Duration,
    /// The bytes each window must bring.
    least: u64,
    /// The current window, from the first wait after the last one ended,
    /// and what came in it so far.
    sleep: Option<Pin<Box<Sleep>>>,
    came: u64,
    state: BodyState,
}

impl RequestBody {
    pub(crate) fn new(inner: Incoming, window: Duration, state: BodyState) -> RequestBody {
        RequestBody { inner, window, least: least_in(window), sleep: None, came: 0, state }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            let came = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()).map_or(0, |d| d.len() as u64);
            this.came += came;
            this.state.0.1.fetch_add(came, Ordering::Relaxed);
            if this.came >= this.least {
                (this.sleep, this.came) = (None, 0);
            }
            if frame.is_none() || this.inner.is_end_stream() {
                this.state.0.0[1].store(true, Ordering::Relaxed);
            }
            return Poll::Ready(frame.map(|f| f.map_err(BodyError::from)));
        }
        let window = this.window;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(window)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.state.0.0[0].store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(BodyError::TooSlow(window))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether a request carries a body to read: a length above zero, or
/// chunked.
pub(crate) fn has_body(headers: &http::HeaderMap) -> bool {
    headers.contains_key(http::header::TRANSFER_ENCODING) || super::content_length(headers).is_some_and(|n| n > 0)
}
