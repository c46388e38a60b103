//! Upload bodies as the store sees them: the checksums a client declared
//! (`x-amz-checksum-*` headers, or trailers after an aws-chunked body, the
//! default of current SDKs) computed while the bytes stream and compared at
//! the end; a mismatch fails the body, so the store keeps nothing.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use http::HeaderMap;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Crc32, Crc32c, Crc64Nvme, Sha1, Sha256};
use s3s::dto::{Checksum, StreamingBlob};
use s3s::{S3Error, S3Result, StdError, TrailingHeaders, s3_error};

use crate::catalog::CHECKSUM_HEADER_PREFIX;

/// The checksum algorithms checked and kept, by header name.
pub(super) const ALGORITHMS: [&str; 5] = [
    "x-amz-checksum-crc32",
    "x-amz-checksum-crc32c",
    "x-amz-checksum-crc64nvme",
    "x-amz-checksum-sha1",
    "x-amz-checksum-sha256",
];

/// Whether `name` (lower case) declares a checksum's value: an
/// `x-amz-checksum-*` header other than those that choose an algorithm,
/// a type or a mode.
pub(super) fn is_checksum_value(name: &str) -> bool {
    name.strip_prefix(CHECKSUM_HEADER_PREFIX).is_some_and(|a| !["algorithm", "type", "mode"].contains(&a))
}

/// Refuses a checksum declared in an algorithm not among [`ALGORITHMS`]
/// (S3 also offers SHA-512, MD5 and three XXHASHes): it would be neither
/// checked nor kept, and the client would believe it was.
pub(super) fn refuse_unknown_checksum<'a>(names: impl IntoIterator<Item = &'a str>) -> S3Result<()> {
    match names.into_iter().find(|n| is_checksum_value(n) && !ALGORITHMS.contains(n)) {
        None => Ok(()),
        Some(name) => Err(s3_error!(
            NotImplemented,
            "{name} is not supported: checksums may be CRC32, CRC32C, CRC64NVME, SHA1 or SHA256"
        )),
    }
}

/// The checksums an input of the protocol layer declares in its five
/// checksum fields: a PutObject's or UploadPart's (from its headers or a
/// form's fields), a CompleteMultipartUpload's, or a completed part's.
macro_rules! declared {
    ($input:expr) => {
        s3s::dto::Checksum {
            checksum_crc32: $input.checksum_crc32.clone(),
            checksum_crc32c: $input.checksum_crc32c.clone(),
            checksum_crc64nvme: $input.checksum_crc64nvme.clone(),
            checksum_sha1: $input.checksum_sha1.clone(),
            checksum_sha256: $input.checksum_sha256.clone(),
            ..s3s::dto::Checksum::default()
        }
    };
}
pub(super) use declared;

pub(super) fn field(c: &Checksum, name: &str) -> Option<String> {
    match name {
        "x-amz-checksum-crc32" => c.checksum_crc32.clone(),
        "x-amz-checksum-crc32c" => c.checksum_crc32c.clone(),
        "x-amz-checksum-crc64nvme" => c.checksum_crc64nvme.clone(),
        "x-amz-checksum-sha1" => c.checksum_sha1.clone(),
        "x-amz-checksum-sha256" => c.checksum_sha256.clone(),
        _ => None,
    }
}

/// The checksums of `c` as the headers that declared them, to be stored
/// with the object and answered with it.
pub fn headers_of(c: &Checksum) -> Vec<(String, String)> {
    ALGORITHMS.iter().filter_map(|name| Some((name.to_string(), field(c, name)?))).collect()
}

/// A checksum stored as a header ([`headers_of`]), as S3's fields.
pub fn from_header(name: &str, value: &str) -> Checksum {
    let mut c = Checksum::default();
    set_field(&mut c, name, value);
    c
}

/// Sets the field of `c` that the header `name` holds.
pub fn set_field(c: &mut Checksum, name: &str, value: &str) {
    let value = Some(value.to_string());
    match name {
        "x-amz-checksum-crc32" => c.checksum_crc32 = value,
        "x-amz-checksum-crc32c" => c.checksum_crc32c = value,
        "x-amz-checksum-crc64nvme" => c.checksum_crc64nvme = value,
        "x-amz-checksum-sha1" => c.checksum_sha1 = value,
        "x-amz-checksum-sha256" => c.checksum_sha256 = value,
        _ => {}
    }
}

/// Checks a document sent whole (the XML of DeleteObjects or
/// CompleteMultipartUpload) against what its headers declare: its
/// Content-MD5, its `x-amz-content-sha256` and, when `checksums` (they
/// are the document's, not an object's), any `x-amz-checksum-*`; one in
/// an algorithm not computed here is refused either way. A
/// document changed on the way would otherwise delete or assemble other
/// objects than the client meant.
pub fn check_document(headers: &HeaderMap, body: &[u8], checksums: bool) -> S3Result<()> {
    if let Some(md5) = headers.get("content-md5") {
        let declared = md5.to_str().ok().and_then(|v| crate::http::content_md5(v).ok());
        let declared = declared.ok_or_else(|| s3_error!(InvalidDigest, "the Content-MD5 is not a base64 MD5"))?;
        if declared != <md5::Md5 as md5::Digest>::digest(body)[..] {
            return Err(s3_error!(BadDigest, "the body does not match its Content-MD5"));
        }
    }
    let payload = headers.get("x-amz-content-sha256").and_then(|v| v.to_str().ok()).unwrap_or("");
    if payload.len() == 64
        && payload.bytes().all(|b| b.is_ascii_hexdigit())
        && !payload.eq_ignore_ascii_case(&hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body)))
    {
        return Err(super::bad_request(
            "XAmzContentSHA256Mismatch",
            "the body does not match its x-amz-content-sha256",
        ));
    }
    refuse_unknown_checksum(headers.keys().map(|n| n.as_str()))?;
    if !checksums {
        return Ok(());
    }
    let declared: Vec<(&str, String)> = ALGORITHMS
        .iter()
        .filter_map(|name| Some((*name, headers.get(*name)?.to_str().unwrap_or("").trim().to_string())))
        .collect();
    if declared.is_empty() {
        return Ok(());
    }
    one_algorithm(declared.len())?;
    let mut hasher = hasher_for(declared.iter().map(|(name, _)| *name));
    hasher.update(body);
    let computed = hasher.finalize();
    match declared.iter().find(|(name, value)| field(&computed, name).as_deref() != Some(value.as_str())) {
        Some((name, _)) => Err(s3_error!(BadDigest, "the body does not match its {name}")),
        None => Ok(()),
    }
}

/// Where a [`Document`] leaves the S3 error it failed with, for the answer.
pub(super) type Refusal = Arc<Mutex<Option<S3Error>>>;

/// A document sent whole (the XML of DeleteObjects or
/// CompleteMultipartUpload) as the protocol layer reads it: kept as it
/// comes, up to `max` bytes, and checked at its end ([`check_document`]):
/// with its last byte by its Content-Length, since the protocol layer
/// stops reading there (it checks the SHA-256 the signature covers itself,
/// but answers a mismatch as its own failure).
/// The protocol layer reads a document only once the request's signature
/// and the caller's access are checked, so no one without them makes the
/// server hold one. A document that fails the check ends with an error and
/// leaves the S3 error in its [`Refusal`], which the answer then is.
pub(super) struct Document<B> {
    inner: B,
    headers: HeaderMap,
    checksums: bool,
    max: usize,
    read: Vec<u8>,
    /// Checked already: the declared length came.
    checked: bool,
    refusal: Refusal,
}

impl<B> Document<B> {
    /// `checksums`: as [`check_document`]'s.
    pub(super) fn new(inner: B, headers: HeaderMap, checksums: bool, max: usize) -> (Document<B>, Refusal) {
        let refusal = Refusal::default();
        let document =
            Document { inner, headers, checksums, max, read: Vec::new(), checked: false, refusal: refusal.clone() };
        (document, refusal)
    }

    /// Checks the document once: `None` when it passes.
    fn check(&mut self) -> Option<S3Error> {
        if std::mem::replace(&mut self.checked, true) {
            return None;
        }
        check_document(&self.headers, &self.read, self.checksums).err()
    }

    fn refuse(&self, e: S3Error) -> Poll<Option<Result<http_body::Frame<Bytes>, StdError>>> {
        let message = e.message().unwrap_or("the document was refused").to_string();
        *self.refusal.lock().expect("not poisoned") = Some(e);
        Poll::Ready(Some(Err(message.into())))
    }
}

impl<B> http_body::Body for Document<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, StdError>>> {
        let this = &mut *self;
        match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if this.read.len() + data.len() > this.max {
                        return this.refuse(s3_error!(
                            MaxMessageLengthExceeded,
                            "the document is over {} bytes",
                            this.max
                        ));
                    }
                    this.read.extend_from_slice(data);
                    if crate::http::content_length(&this.headers) == Some(this.read.len() as u64)
                        && let Some(e) = this.check()
                    {
                        return this.refuse(e);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            None => match this.check() {
                None => Poll::Ready(None),
                Some(e) => this.refuse(e),
            },
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// As S3: a request declares at most one checksum.
fn one_algorithm(declared: usize) -> S3Result<()> {
    match declared {
        0 | 1 => Ok(()),
        _ => Err(s3_error!(
            InvalidRequest,
            "a request may declare one x-amz-checksum-* header or trailer, not {declared}"
        )),
    }
}

/// A hasher of the algorithms named (by header name, of [`ALGORITHMS`]).
pub(super) fn hasher_for<'a>(names: impl Iterator<Item = &'a str>) -> ChecksumHasher {
    let mut hasher = ChecksumHasher::default();
    for name in names {
        match name {
            "x-amz-checksum-crc32" => hasher.crc32 = Some(Crc32::new()),
            "x-amz-checksum-crc32c" => hasher.crc32c = Some(Crc32c::new()),
            "x-amz-checksum-crc64nvme" => hasher.crc64nvme = Some(Crc64Nvme::new()),
            "x-amz-checksum-sha1" => hasher.sha1 = Some(Sha1::new()),
            _ => hasher.sha256 = Some(Sha256::new()),
        }
    }
    hasher
}

/// Where a declared checksum's value comes from.
enum Declared {
    Header(String),
    Trailer(TrailingHeaders),
}

/// The first error a body met, kept for the answer: the store only sees
/// that the body failed.
#[derive(Clone, Default)]
pub struct Failure(Arc<Mutex<Option<S3Error>>>);

impl Failure {
    fn set(&self, e: S3Error) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
    }

    pub fn take(&self) -> Option<S3Error> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// An error of the protocol layer's body streams as an S3 error. Their
/// error types are private to s3s, so the payload-hash and chunk-signature
/// failures are recognised by name.
fn protocol_failure(e: &StdError) -> S3Error {
    if let Some(s3) = e.downcast_ref::<S3Error>() {
        let mut copy = S3Error::new(s3.code().clone());
        copy.set_message(s3.message().unwrap_or("the body was rejected").to_string());
        return copy;
    }
    let text = e.to_string();
    if text.contains("Sha256Mismatch") {
        super::bad_request("XAmzContentSHA256Mismatch", "the body does not match its x-amz-content-sha256")
    } else if text.contains("SignatureMismatch") {
        s3_error!(SignatureDoesNotMatch, "a chunk signature of the body does not match")
    } else if text.contains("Incomplete") || text.contains("LengthMismatch") {
        s3_error!(IncompleteBody, "the body is shorter or longer than declared")
    } else {
        s3_error!(InvalidRequest, "reading the body failed: {text}")
    }
}

/// A stream whose bytes are hashed as they pass, with one algorithm:
/// the checksum of a part copied from another object, which no client
/// declared, in the algorithm its upload chose.
pub struct Hashed<S> {
    inner: S,
    hasher: Option<ChecksumHasher>,
    /// The checksum, once the stream ended.
    pub computed: Arc<Mutex<Option<Checksum>>>,
}

impl<S> Hashed<S> {
    /// Hashes `inner` by `algorithm`, a header name of [`ALGORITHMS`];
    /// with none, computes nothing.
    pub fn new(inner: S, algorithm: Option<&str>) -> Hashed<S> {
        Hashed { inner, hasher: algorithm.map(|a| hasher_for([a].into_iter())), computed: Arc::default() }
    }
}

impl<S: Stream<Item = Result<Bytes, E>> + Unpin, E> Stream for Hashed<S> {
    type Item = Result<Bytes, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let next = Pin::new(&mut this.inner).poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(h) = &mut this.hasher {
                    h.update(chunk);
                }
            }
            Poll::Ready(None) => {
                if let Some(h) = this.hasher.take() {
                    *this.computed.lock().unwrap_or_else(|p| p.into_inner()) = Some(h.finalize());
                }
            }
            _ => {}
        }
        next
    }
}

/// A body that checks declared checksums.
pub struct Checked {
    inner: StreamingBlob,
    hasher: ChecksumHasher,
    declared: Vec<(&'static str, Declared)>,
    failure: Failure,
    ended: bool,
    /// The checksums computed, once the body ended well.
    pub computed: Arc<Mutex<Option<Checksum>>>,
}

impl Checked {
    /// Wraps `body`. `values` are the checksums the request declares
    /// before its body: its headers', or a form's fields, as the protocol
    /// layer parsed them. `headers` are the request's, `trailers` the
    /// handle to its trailing headers.
    pub fn new(
        body: StreamingBlob,
        values: &Checksum,
        headers: &HeaderMap,
        trailers: Option<TrailingHeaders>,
        failure: Failure,
    ) -> S3Result<Checked> {
        refuse_unknown_checksum(headers.keys().map(|n| n.as_str()))?;
        // The protocol layer takes an empty value for none: it is an error.
        if let Some(name) =
            ALGORITHMS.iter().find(|n| headers.get(**n).is_some_and(|v| v.as_bytes().trim_ascii().is_empty()))
        {
            return Err(s3_error!(InvalidArgument, "{name} is empty"));
        }
        let mut declared: Vec<_> =
            ALGORITHMS.into_iter().filter_map(|name| Some((name, Declared::Header(field(values, name)?)))).collect();
        if let Some(names) = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()) {
            let names: Vec<String> = names.split(',').map(|n| n.trim().to_ascii_lowercase()).collect();
            refuse_unknown_checksum(names.iter().map(String::as_str))?;
            for name in names {
                let Some(known) = ALGORITHMS.iter().find(|a| **a == name) else {
                    continue;
                };
                let trailers = trailers
                    .clone()
                    .ok_or_else(|| s3_error!(InvalidRequest, "x-amz-trailer needs an aws-chunked body"))?;
                declared.push((known, Declared::Trailer(trailers)));
            }
        }
        one_algorithm(declared.len())?;
        let hasher = hasher_for(declared.iter().map(|(name, _)| *name));
        Ok(Checked { inner: body, hasher, declared, failure, ended: false, computed: Arc::default() })
    }

    /// The header name of the checksum the body declares, if any.
    pub fn algorithm(&self) -> Option<&'static str> {
        self.declared.first().map(|(name, _)| *name)
    }

    /// Compares what was declared with what the bytes hashed to.
    fn verify(&mut self) -> Result<(), S3Error> {
        let computed = std::mem::take(&mut self.hasher).finalize();
        for (name, declared) in &self.declared {
            let expected = match declared {
                Declared::Header(v) => Some(v.clone()),
                Declared::Trailer(t) => {
                    t.read(|h| h.get(*name).and_then(|v| v.to_str().ok()).map(str::to_string)).flatten()
                }
            };
            let Some(expected) = expected else {
                return Err(s3_error!(InvalidRequest, "the trailer {name} announced in x-amz-trailer never came"));
            };
            if field(&computed, name).as_deref() != Some(expected.trim()) {
                return Err(s3_error!(BadDigest, "the body does not match its {name}"));
            }
        }
        *self.computed.lock().unwrap_or_else(|p| p.into_inner()) = Some(computed);
        Ok(())
    }
}

impl Stream for Checked {
    type Item = Result<Bytes, StdError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                this.hasher.update(&chunk);
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                let failure = protocol_failure(&e);
                let message = failure.message().unwrap_or("the body was rejected").to_string();
                this.failure.set(failure);
                Poll::Ready(Some(Err(message.into())))
            }
            Poll::Ready(None) => {
                this.ended = true;
                match this.verify() {
                    Ok(()) => Poll::Ready(None),
                    Err(e) => {
                        let message = e.message().unwrap_or("checksum mismatch").to_string();
                        this.failure.set(e);
                        Poll::Ready(Some(Err(message.into())))
                    }
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use s3s::S3ErrorCode;

    use super::*;

    fn check(headers: &[(&'static str, &'static str)]) -> S3Result<Checked> {
        let headers: HeaderMap = headers
            .iter()
            .map(|(n, v)| (http::HeaderName::from_static(n), http::HeaderValue::from_static(v)))
            .collect();
        let body = StreamingBlob::from(s3s::Body::empty());
        Checked::new(body, &Checksum::default(), &headers, None, Failure::default())
    }

    #[test]
    fn checksums_in_algorithms_not_computed_here_are_refused() {
        for declared in [("x-amz-checksum-sha512", "AAAA"), ("x-amz-trailer", "x-amz-checksum-xxhash64")] {
            let refused = check(&[declared]).err().expect("refused");
            assert_eq!(*refused.code(), S3ErrorCode::NotImplemented, "{declared:?}");
        }
        let refused = check(&[("x-amz-checksum-sha256", " ")]).err().expect("refused");
        assert_eq!(*refused.code(), S3ErrorCode::InvalidArgument, "an empty value");
        // Choosing an algorithm, a type or a mode declares no value.
        let chosen = [
            ("x-amz-checksum-algorithm", "CRC32"),
            ("x-amz-checksum-type", "COMPOSITE"),
            ("x-amz-checksum-mode", "ENABLED"),
        ];
        assert!(check(&chosen).is_ok());
        // A value is read from what the protocol layer parsed.
        let values = from_header("x-amz-checksum-sha256", "AAAA");
        let body = StreamingBlob::from(s3s::Body::empty());
        let checked = Checked::new(body, &values, &HeaderMap::new(), None, Failure::default()).unwrap();
        assert_eq!(checked.algorithm(), Some("x-amz-checksum-sha256"));
    }
}
