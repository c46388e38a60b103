//! Batch bodies: the `key\nlength\nbytes\n` framing of batch put, read
//! whole and in small network pieces (the answer must not depend on how
//! the bytes arrive), and the key lists of batch get and delete.
#![no_main]

use bytes::Bytes;
use depot::http::fuzzing::{batch_keys, batch_put};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&piece, body)) = data.split_first() else { return };
    let max_key = 64;
    let whole = batch_put(vec![Bytes::copy_from_slice(body)], max_key);
    let pieces = body.chunks(usize::from(piece % 7) + 1).map(Bytes::copy_from_slice).collect();
    let split = batch_put(pieces, max_key);
    match (&whole, &split) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!((a.status, a.code), (b.status, b.code)),
        _ => panic!("whole: {whole:?}, in pieces: {split:?}"),
    }
    if let Ok(entries) = whole {
        for (key, len, got) in entries {
            assert!(key.len() <= max_key);
            assert_eq!(len, got as u64, "{key:?}: the bytes read are not the length declared");
        }
    }
    if let Ok(keys) = batch_keys(body, 100) {
        assert!(keys.len() <= 100);
        assert!(keys.iter().all(|k| !k.is_empty() && !k.contains('\n')));
    }
});
