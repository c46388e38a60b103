//! The aws-chunked framing of streamed uploads (signed chunks, or checksums
//! in trailers: what SDKs send by default), checked as it passes on its way
//! to the protocol layer. That layer gathers each chunk whole before it
//! hands it on, so a chunk's declared size is memory the upload holds: one
//! chunk of 1 GiB held 1 GiB. Chunks larger than [`MAX_CHUNK`] are refused
//! before their bytes come, as MinIO refuses them; SDKs send 64 KiB to
//! 1 MiB.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Largest chunk an upload may declare.
pub const MAX_CHUNK: u64 = 16 << 20;

/// Longest chunk-size line (the size, a signature, CRLF) looked at; the
/// protocol layer refuses longer ones too.
const MAX_LINE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    #[error("an aws-chunked chunk of {0} bytes; at most {MAX_CHUNK} are allowed")]
    ChunkTooLarge(u64),
    #[error("an aws-chunked chunk-size line that does not declare a size in hexadecimal")]
    BadSize,
}

/// Where the stream stands in the framing.
enum State {
    /// In a chunk-size line, with what came of it so far.
    Line(Vec<u8>),
    /// In a chunk: the bytes left of it and of its CRLF.
    Data(u64),
    /// Past the last chunk: trailers, left to the protocol layer.
    Trailers,
}

/// An aws-chunked body whose chunks are checked for size as they are
/// declared; the bytes, and the size hint the protocol layer reads as the
/// body's length, pass unchanged.
pub struct Checked<B> {
    inner: B,
    state: State,
}

impl<B> Checked<B> {
    pub fn new(inner: B) -> Checked<B> {
        Checked { inner, state: State::Line(Vec::new()) }
    }
}

impl State {
    /// Follows the framing through `bytes`.
    fn pass(&mut self, mut bytes: &[u8]) -> Result<(), FramingError> {
        while !bytes.is_empty() {
            match self {
                State::Trailers => return Ok(()),
                State::Data(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        *self = State::Line(Vec::new());
                    }
                }
                State::Line(line) => {
                    let end = bytes.iter().position(|&b| b == b'\n');
                    let take = end.map_or(bytes.len(), |at| at + 1);
                    if line.len() + take > MAX_LINE {
                        return Err(FramingError::BadSize);
                    }
                    line.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if end.is_none() {
                        continue;
                    }
                    *self = match chunk_size(line)? {
                        0 => State::Trailers,
                        size if size > MAX_CHUNK => return Err(FramingError::ChunkTooLarge(size)),
                        size => State::Data(size + 2),
                    };
                }
            }
        }
        Ok(())
    }
}

/// The size a chunk-size line declares: hexadecimal digits, up to a `;`
/// (a signature follows) or the line's end.
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let digits = line.split(|&b| b == b';' || b == b'\r' || b == b'\n').next().unwrap_or_default();
    let digits = std::str::from_utf8(digits).map_err(|_| FramingError::BadSize)?;
    if digits.is_empty() || digits.len() > 16 {
        return Err(FramingError::BadSize);
    }
    u64::from_str_radix(digits, 16).map_err(|_| FramingError::BadSize)
}

impl<B> Body for Checked<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<s3s::StdError>,
{
    type Data = Bytes;
    type Error = s3s::StdError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        Poll::Ready(match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => Some(match frame.data_ref().map_or(Ok(()), |bytes| this.state.pass(bytes)) {
                Ok(()) => Ok(frame),
                Err(e) => Err(e.into()),
            }),
            Some(Err(e)) => Some(Err(e.into())),
            None => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Follows `pieces` as they would come off the socket.
    fn follow(pieces: &[&[u8]]) -> Result<(), FramingError> {
        let mut state = State::Line(Vec::new());
        pieces.iter().try_for_each(|p| state.pass(p))
    }

    #[test]
    fn chunks_are_followed_across_pieces_however_cut() {
        let framed = b"5;chunk-signature=ab\r\nhello\r\n3\r\nabc\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n";
        for cut in 0..framed.len() {
            let (a, b) = framed.split_at(cut);
            follow(&[a, b]).unwrap();
        }
        let bytes: Vec<&[u8]> = framed.chunks(1).collect();
        follow(&bytes).unwrap();
    }

    #[test]
    fn a_chunk_over_the_limit_is_refused_by_its_size_line() {
        assert!(matches!(follow(&[b"1000000\r\n"]), Ok(())));
        assert!(matches!(follow(&[b"1000001;chunk-signature=ab\r\n"]), Err(FramingError::ChunkTooLarge(0x100_0001))));
        // The size of the second chunk, after a first one passed.
        assert!(matches!(follow(&[b"2\r\nab\r\n", b"4000", b"0000\r\n"]), Err(FramingError::ChunkTooLarge(_))));
    }

    #[test]
    fn size_lines_that_are_not_sizes_are_refused() {
        for line in [&b"zz\r\n"[..], b"\r\n", b";sig\r\n", b"11111111111111111\r\n", &[b'1'; MAX_LINE + 10]] {
            assert!(matches!(follow(&[line]), Err(FramingError::BadSize)), "{:?}", String::from_utf8_lossy(line));
        }
    }
}
