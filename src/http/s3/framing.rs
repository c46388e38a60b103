//! The aws-chunked framing of streamed uploads (signed chunks, or checksums
//! in trailers: what SDKs send by default), followed on its way to the
//! protocol layer. That layer gathers each chunk whole before it hands it
//! on, so a chunk's declared size is memory the upload holds, and SDKs
//! differ: most send 64 KiB chunks, but some send a whole part, or a whole
//! object, as one chunk when it is not signed.
//! - A chunk without a signature is cut into pieces of at most
//!   [`MAX_PIECE`], each with a size line of its own: the checksum in the
//!   trailer covers the bytes, not how they were cut.
//! - A signed chunk cannot be cut (its signature covers it whole): one
//!   declaring more than [`MAX_CHUNK`] is refused by its size line, before
//!   its bytes come, as MinIO refuses it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Largest signed chunk an upload may declare.
pub const MAX_CHUNK: u64 = 16 << 20;

/// Largest piece an unsigned chunk is handed on in.
pub const MAX_PIECE: u64 = 1 << 20;

/// Longest chunk-size line (the size, a signature, CRLF) looked at; the
/// protocol layer refuses longer ones too.
const MAX_LINE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    #[error("an aws-chunked chunk of {0} bytes; at most {MAX_CHUNK} are allowed")]
    ChunkTooLarge(u64),
    #[error("an aws-chunked chunk-size line that does not declare a size in at most 8 hexadecimal digits")]
    BadSize,
    /// Named so the answer is S3's IncompleteBody.
    #[error("Incomplete aws-chunked body: it ends before its last chunk, of size 0")]
    Incomplete,
}

/// Where the stream stands in the framing.
enum State {
    /// In a chunk-size line, held until it ends.
    Line(Vec<u8>),
    /// In a chunk: the bytes left of the piece handed on now, and of the
    /// chunk after it.
    Data { piece: u64, rest: u64 },
    /// In the CRLF that ends a chunk: the bytes left of it.
    End(u64),
    /// Past the last chunk: trailers, left to the protocol layer.
    Trailers,
}

/// Follows the framing of one upload.
struct Framing {
    state: State,
    /// The chunks carry no signatures, and may be cut.
    unsigned: bool,
    /// The largest piece an unsigned chunk is handed on in: [`MAX_PIECE`]
    /// (smaller for fuzzing, which sends few bytes).
    max_piece: u64,
}

impl Framing {
    /// Follows the framing through `bytes`, queueing what to hand on.
    fn pass(&mut self, bytes: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), FramingError> {
        let mut at = 0;
        while at < bytes.len() {
            let left = (bytes.len() - at) as u64;
            match &mut self.state {
                State::Trailers => {
                    out.push_back(bytes.slice(at..));
                    return Ok(());
                }
                State::Data { piece, rest } => {
                    let n = (*piece).min(left) as usize;
                    out.push_back(bytes.slice(at..at + n));
                    at += n;
                    *piece -= n as u64;
                    if *piece == 0 {
                        self.state = match *rest {
                            0 => State::End(2),
                            rest => {
                                let next = rest.min(self.max_piece);
                                out.push_back(Bytes::from(format!("\r\n{next:x}\r\n")));
                                State::Data { piece: next, rest: rest - next }
                            }
                        };
                    }
                }
                State::End(end) => {
                    let n = (*end).min(left) as usize;
                    out.push_back(bytes.slice(at..at + n));
                    at += n;
                    *end -= n as u64;
                    if *end == 0 {
                        self.state = State::Line(Vec::new());
                    }
                }
                State::Line(line) => {
                    let end = bytes[at..].iter().position(|&b| b == b'\n');
                    let take = end.map_or(bytes.len() - at, |to| to + 1);
                    if line.len() + take > MAX_LINE {
                        return Err(FramingError::BadSize);
                    }
                    line.extend_from_slice(&bytes[at..at + take]);
                    at += take;
                    if end.is_none() {
                        continue;
                    }
                    let line = std::mem::take(line);
                    let (size, digits) = chunk_size(&line)?;
                    let cut = self.unsigned && size > self.max_piece;
                    // A line handed on as it came must say what the protocol
                    // layer reads in it: no more than 8 digits, as it reads
                    // those and drops the rest.
                    if digits > 8 && !cut {
                        return Err(FramingError::BadSize);
                    }
                    self.state = match size {
                        0 => {
                            out.push_back(Bytes::from(line));
                            State::Trailers
                        }
                        size if cut => {
                            out.push_back(Bytes::from(format!("{:x}\r\n", self.max_piece)));
                            State::Data { piece: self.max_piece, rest: size - self.max_piece }
                        }
                        size if size > MAX_CHUNK => return Err(FramingError::ChunkTooLarge(size)),
                        size => {
                            out.push_back(Bytes::from(line));
                            State::Data { piece: size, rest: 0 }
                        }
                    };
                }
            }
        }
        Ok(())
    }
}

/// What the framing hands on of a body that arrives in `pieces`, cutting
/// unsigned chunks into pieces of `max_piece` bytes at most, or why it
/// refuses it (for the tests and the fuzz target).
pub(crate) fn follow(
    pieces: impl IntoIterator<Item = Bytes>,
    unsigned: bool,
    max_piece: u64,
) -> Result<Vec<u8>, FramingError> {
    let mut framing = Framing { state: State::Line(Vec::new()), unsigned, max_piece };
    let mut out = VecDeque::new();
    for piece in pieces {
        framing.pass(piece, &mut out)?;
    }
    Ok(out.into_iter().flatten().collect())
}

/// An aws-chunked body followed as it comes (see the module's comment).
pub struct Checked<B> {
    inner: B,
    framing: Framing,
    /// Bytes to hand on before reading more.
    out: VecDeque<Bytes>,
}

impl<B> Checked<B> {
    /// `unsigned`: the stream's chunks carry no signatures
    /// (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`).
    pub fn new(inner: B, unsigned: bool) -> Checked<B> {
        let framing = Framing { state: State::Line(Vec::new()), unsigned, max_piece: MAX_PIECE };
        Checked { inner, framing, out: VecDeque::new() }
    }
}

/// The size a chunk-size line declares, and in how many digits:
/// hexadecimal digits, up to a `;` (a signature follows) or the line's end.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), FramingError> {
    let digits = line.split(|&b| b == b';' || b == b'\r' || b == b'\n').next().unwrap_or_default();
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(FramingError::BadSize);
    }
    let digits = std::str::from_utf8(digits).map_err(|_| FramingError::BadSize)?;
    let size = u64::from_str_radix(digits, 16).map_err(|_| FramingError::BadSize)?;
    Ok((size, digits.len()))
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
        loop {
            if let Some(bytes) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(bytes) => this.framing.pass(bytes, &mut this.out)?,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None if !matches!(this.framing.state, State::Trailers) => {
                    this.framing.state = State::Trailers;
                    return Poll::Ready(Some(Err(FramingError::Incomplete.into())));
                }
                None => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.out.is_empty() && matches!(self.framing.state, State::Trailers) && self.inner.is_end_stream()
    }

    /// Cut chunks take more size lines than were sent: the body's length
    /// is known only as a floor (the protocol layer reads the decoded
    /// length from `x-amz-decoded-content-length`).
    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        hint.set_lower(self.inner.size_hint().lower());
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Follows `pieces` as they would come off the socket: what is handed on.
    fn follow(pieces: &[&[u8]], unsigned: bool) -> Result<Vec<u8>, FramingError> {
        super::follow(pieces.iter().map(|p| Bytes::copy_from_slice(p)), unsigned, MAX_PIECE)
    }

    /// The chunks of a framed body: (size, bytes), up to the last.
    fn chunks(mut framed: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut found = Vec::new();
        loop {
            let end = framed.iter().position(|&b| b == b'\n').unwrap() + 1;
            let (size, _) = chunk_size(&framed[..end]).unwrap();
            if size == 0 {
                return found;
            }
            let data = &framed[end..end + size as usize];
            assert_eq!(&framed[end + size as usize..end + size as usize + 2], b"\r\n");
            found.push((size, data.to_vec()));
            framed = &framed[end + size as usize + 2..];
        }
    }

    #[test]
    fn chunks_are_followed_across_pieces_however_cut() {
        let framed = b"5;chunk-signature=ab\r\nhello\r\n3\r\nabc\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n";
        for unsigned in [false, true] {
            for cut in 0..framed.len() {
                let (a, b) = framed.split_at(cut);
                assert_eq!(follow(&[a, b], unsigned).unwrap(), framed, "cut at {cut}");
            }
            let bytes: Vec<&[u8]> = framed.chunks(1).collect();
            assert_eq!(follow(&bytes, unsigned).unwrap(), framed);
        }
    }

    #[test]
    fn a_large_unsigned_chunk_is_handed_on_in_pieces() {
        let size = 2 * MAX_PIECE as usize + 12_345;
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut framed = format!("{size:x}\r\n").into_bytes();
        framed.extend_from_slice(&data);
        framed.extend_from_slice(b"\r\n2\r\nok\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n");
        for cut in [1, 7, 65_536, MAX_PIECE as usize + 3] {
            let pieces: Vec<&[u8]> = framed.chunks(cut).collect();
            let out = follow(&pieces, true).unwrap();
            let found = chunks(&out);
            let sizes: Vec<u64> = found.iter().map(|(n, _)| *n).collect();
            assert_eq!(sizes, [MAX_PIECE, MAX_PIECE, 12_345, 2], "cut every {cut}");
            let bytes: Vec<u8> = found.into_iter().flat_map(|(_, d)| d).collect();
            assert_eq!(&bytes[..size], &data[..]);
            assert_eq!(&bytes[size..], b"ok");
            assert!(out.ends_with(b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"));
        }
    }

    #[test]
    fn a_signed_chunk_over_the_limit_is_refused_by_its_size_line() {
        assert!(follow(&[b"1000000\r\n"], false).is_ok());
        let over: &[u8] = b"1000001;chunk-signature=ab\r\n";
        assert!(matches!(follow(&[over], false), Err(FramingError::ChunkTooLarge(0x100_0001))));
        // The size of the second chunk, after a first one passed.
        assert!(matches!(follow(&[b"2\r\nab\r\n", b"4000", b"0000\r\n"], false), Err(FramingError::ChunkTooLarge(_))));
        // Unsigned, it is cut instead.
        assert!(follow(&[b"40000000\r\n"], true).unwrap().starts_with(b"100000\r\n"));
    }

    /// A body that ends before its 0-size chunk fails, as does one cut in
    /// a size line or a chunk's data.
    #[tokio::test]
    async fn a_body_without_its_last_chunk_is_incomplete() {
        use http_body_util::BodyExt;
        let read = |framed: &'static [u8]| async move {
            let body = Checked::new(http_body_util::Full::new(Bytes::from_static(framed)), false);
            body.collect().await.map(|b| b.to_bytes())
        };
        let whole: &[u8] = b"5;chunk-signature=ab\r\nhello\r\n0;chunk-signature=cd\r\n\r\n";
        assert_eq!(read(whole).await.unwrap(), whole);
        for cut in [b"5;chunk-signature=ab\r\nhello\r\n".len(), 4, 25, whole.len() - 10] {
            let e = read(&whole[..cut]).await.unwrap_err();
            assert!(e.to_string().starts_with("Incomplete"), "cut at {cut}: {e}");
        }
    }

    /// The protocol layer reads 8 digits of a size and drops the rest: a
    /// longer size handed on would make it read a chunk of another size
    /// than the one checked here.
    #[test]
    fn sizes_of_more_than_eight_digits_are_refused_unless_cut() {
        for line in [&b"000000010\r\n"[..], b"000000010;chunk-signature=ab\r\n", b"000000000\r\n"] {
            for unsigned in [false, true] {
                let refused = matches!(follow(&[line], unsigned), Err(FramingError::BadSize));
                assert!(refused, "{:?}", String::from_utf8_lossy(line));
            }
        }
        assert!(follow(&[b"00000010\r\n"], false).is_ok());
        // An unsigned chunk that is cut goes on under size lines of ours.
        let out = follow(&[b"0000000200000\r\n"], true).unwrap();
        assert_eq!(out, format!("{MAX_PIECE:x}\r\n").into_bytes());
    }

    #[test]
    fn size_lines_that_are_not_sizes_are_refused() {
        let lines = [&b"zz\r\n"[..], b"\r\n", b";sig\r\n", b"+5\r\n", b"11111111111111111\r\n", &[b'1'; MAX_LINE + 10]];
        for line in lines {
            for unsigned in [false, true] {
                let refused = matches!(follow(&[line], unsigned), Err(FramingError::BadSize));
                assert!(refused, "{:?}", String::from_utf8_lossy(line));
            }
        }
    }
}
