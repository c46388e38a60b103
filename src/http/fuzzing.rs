//! Entry points for the fuzz targets in `fuzz/`: the parsers of untrusted
//! input that are private to the HTTP layer, each fed raw bytes. Not an API:
//! the targets assert the invariants; these only reach the code.

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::error::ApiError;
pub use super::native::Endpoint;

/// Header fields from fuzz input: one `name: value` per line; lines that
/// are no valid field (as hyper would have refused them) are skipped.
pub fn headers(data: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some(at) = line.iter().position(|b| *b == b':') else { continue };
        let (name, value) = (HeaderName::from_bytes(&line[..at]), HeaderValue::from_bytes(line[at + 1..].trim_ascii()));
        if let (Ok(name), Ok(value)) = (name, value) {
            map.append(name, value);
        }
    }
    map
}

/// Runs a future that never waits on anything outside itself.
fn block_on<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

/// Batch put framing over a body that arrives in `pieces`: each entry's
/// key, declared length and the bytes read for it, until the body ends or
/// is refused.
pub fn batch_put(pieces: Vec<Bytes>, max_key: usize) -> Result<Vec<(String, u64, usize)>, ApiError> {
    let stream = futures::stream::iter(pieces.into_iter().map(Ok::<_, std::convert::Infallible>));
    let mut body = super::batch::Framed::new(stream);
    block_on(async {
        let mut entries = Vec::new();
        while let Some((key, len)) = body.entry(max_key).await? {
            let mut got = 0;
            let mut bytes = body.take(len);
            while let Some(piece) = bytes.next().await {
                got += piece?.len();
            }
            drop(bytes);
            body.end_of_entry(&key, len).await?;
            entries.push((key, len, got));
        }
        Ok(entries)
    })
}

pub use super::s3::framing::MAX_CHUNK;

/// The aws-chunked framing of an S3 upload whose body arrives in
/// `pieces`: what it hands on to the protocol layer, unsigned chunks cut
/// into pieces of `max_piece` bytes at most, or why it refuses the body.
pub fn s3_framing(pieces: Vec<Bytes>, unsigned: bool, max_piece: u64) -> Result<Vec<u8>, String> {
    super::s3::framing::follow(pieces, unsigned, max_piece).map_err(|e| e.to_string())
}

/// The key list of batch get and delete.
pub fn batch_keys(body: &[u8], max: usize) -> Result<Vec<String>, ApiError> {
    super::batch::keys_of(body, max)
}

/// Whether a request with this target and headers goes to the S3 API, and
/// whether its signing is refused before the protocol layer sees it.
pub fn s3_routing(target: &str, headers: HeaderMap) -> Option<(bool, bool)> {
    let mut req = http::Request::builder().uri(target).body(()).ok()?;
    *req.headers_mut() = headers;
    Some((super::s3::is_s3(&req), super::s3::refused_signing(&req).is_some()))
}

/// The bucket a Host header names under `domain` (virtual-host style), and
/// the host name s3s is given.
pub fn virtual_host(domain: &str, host: &str) -> Result<(Option<String>, String), String> {
    use s3s::host::S3Host;
    let domain = super::s3::Domain(domain.to_ascii_lowercase());
    let parsed = domain.parse_host_header(host).map_err(|e| e.to_string())?;
    Ok((parsed.bucket().map(str::to_string), parsed.domain().to_string()))
}

/// Streams `body` in `pieces` through the checksum checks of S3 uploads
/// declared by `headers` (`x-amz-checksum-*`): whether the body was
/// accepted, and the bytes that came through.
pub fn checksummed_upload(headers: &HeaderMap, pieces: Vec<Bytes>) -> Result<usize, String> {
    let stream = futures::stream::iter(pieces.into_iter().map(Ok::<_, std::io::Error>));
    let blob = s3s::dto::StreamingBlob::wrap(stream);
    let failure = super::s3::body::Failure::default();
    // The declared values as the protocol layer parses them from headers.
    let mut values = s3s::dto::Checksum::default();
    for (name, value) in headers {
        if let Ok(value) = value.to_str() {
            super::s3::body::set_field(&mut values, name.as_str(), value);
        }
    }
    let mut checked =
        super::s3::body::Checked::new(blob, &values, headers, None, failure).map_err(|e| format!("{e:?}"))?;
    block_on(async {
        let mut got = 0;
        while let Some(piece) = checked.next().await {
            got += piece.map_err(|e| e.to_string())?.len();
        }
        Ok(got)
    })
}
