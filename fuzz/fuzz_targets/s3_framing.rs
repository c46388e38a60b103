//! The aws-chunked framing of streamed S3 uploads, fed a body cut into
//! pieces. What it hands on is the same however the body was cut; every
//! size line in it declares its size in at most 8 digits (all the protocol
//! layer reads of one) and no more than the framing allows a chunk; and
//! it carries the body's data bytes unchanged, in order.
#![no_main]

use bytes::Bytes;
use depot::http::fuzzing::{self, MAX_CHUNK};
use libfuzzer_sys::fuzz_target;

/// The data bytes of a framed body, and its chunks' sizes, read as the
/// protocol layer reads them: a size line (hexadecimal digits up to `;` or
/// the line's end), the data, the 2 bytes that end it; up to the 0-size
/// chunk or the body's end. `digits` is the most a size may have.
fn read(mut framed: &[u8], digits: usize) -> (Vec<u8>, Vec<u64>) {
    let (mut data, mut sizes) = (Vec::new(), Vec::new());
    while let Some(end) = framed.iter().position(|&b| b == b'\n') {
        let line = &framed[..end];
        let size = line.split(|&b| b == b';' || b == b'\r').next().unwrap();
        assert!(!size.is_empty() && size.len() <= digits, "size line {:?}", String::from_utf8_lossy(line));
        let size = u64::from_str_radix(std::str::from_utf8(size).unwrap(), 16).unwrap();
        sizes.push(size);
        framed = &framed[end + 1..];
        if size == 0 {
            break;
        }
        let take = framed.len().min(usize::try_from(size).unwrap_or(usize::MAX));
        data.extend_from_slice(&framed[..take]);
        if (take as u64) < size {
            break;
        }
        framed = framed.get(take + 2..).unwrap_or_default();
    }
    (data, sizes)
}

fuzz_target!(|data: &[u8]| {
    let Some((&[how, piece], body)) = data.split_first_chunk() else { return };
    let unsigned = how & 1 == 1;
    let cut = usize::from(how >> 1) + 1;
    // Pieces small enough for the few bytes fuzzing sends.
    let max_piece = u64::from(piece % 64) + 1;
    let whole = fuzzing::s3_framing(vec![Bytes::copy_from_slice(body)], unsigned, max_piece);
    let pieces = body.chunks(cut).map(Bytes::copy_from_slice).collect();
    assert_eq!(fuzzing::s3_framing(pieces, unsigned, max_piece), whole, "cut every {cut}");
    let Ok(out) = whole else { return };
    let (sent, sizes) = read(&out, 8);
    let most = if unsigned { max_piece } else { MAX_CHUNK };
    assert!(sizes.iter().all(|&n| n <= most), "{sizes:?}");
    let (given, _) = read(body, 16);
    assert_eq!(sent, given, "the data bytes");
});
