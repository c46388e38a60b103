//! The conformance suite every [`BlobEngine`] runs: plain async functions
//! taking `&dyn BlobEngine`, so an engine's tests are one call to [`run_all`].
//! Each function asserts one promise of the trait's documentation.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::{BlobEngine, BlobEngineExt, ByteRange, Digest, EngineError, sha2_digest};

/// Deterministic, incompressible test bytes.
pub fn pattern(len: usize, seed: u8) -> Bytes {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed as u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn digest_of(bytes: &[u8]) -> Digest {
    Digest(sha2_digest(bytes))
}

/// Runs the whole suite. Sizes cross the chunking of every engine (1 MiB
/// values, 256 KiB I/O, the hybrid threshold).
pub async fn run_all(engine: &dyn BlobEngine) {
    round_trip(engine).await;
    ranged_reads(engine).await;
    same_content_twice(engine).await;
    abandoned_writes_leave_nothing(engine).await;
    delete_and_stat(engine).await;
    list_reports_every_blob(engine).await;
    read_small_returns_blobs_in_order(engine).await;
}

pub async fn round_trip(engine: &dyn BlobEngine) {
    for (len, seed) in [(0usize, 1u8), (1, 2), (4096, 3), (256 * 1024, 4), (3 * 1024 * 1024 + 17, 5)] {
        let data = pattern(len, seed);
        // Write in uneven pieces, as a network body arrives.
        let mut writer = engine.writer(None).await.unwrap();
        for piece in data.chunks(70_001) {
            writer.write(Bytes::copy_from_slice(piece)).await.unwrap();
        }
        let blob = writer.finish(digest_of(&data)).await.unwrap();
        assert_eq!(blob.size, len as u64, "{}: size of a {len}-byte blob", engine.name());
        assert_eq!(blob.digest, digest_of(&data));
        let back = engine.read_to_vec(&blob, ByteRange::full(len as u64)).await.unwrap();
        assert!(back == data, "{}: {len}-byte blob read back differs", engine.name());
        assert_eq!(engine.stat(&blob).await.unwrap(), Some(len as u64));
    }
}

pub async fn ranged_reads(engine: &dyn BlobEngine) {
    let len = 2 * 1024 * 1024 + 300_000;
    let data = pattern(len, 9);
    let blob = engine.put_bytes(data.clone()).await.unwrap();
    let mib = 1024 * 1024u64;
    let ranges = [
        (0, 1),
        (0, len as u64),
        (5, 6),
        (mib - 1, mib + 1),
        (mib, 2 * mib),
        (mib + 3, len as u64),
        (len as u64 - 1, len as u64),
        (100, 100),
    ];
    for (start, end) in ranges {
        let got = engine.read_to_vec(&blob, ByteRange { start, end }).await.unwrap();
        assert!(got == data[start as usize..end as usize], "{}: range {start}..{end} differs", engine.name());
    }
}

pub async fn same_content_twice(engine: &dyn BlobEngine) {
    let data = pattern(1_500_000, 11);
    let digest = digest_of(&data);
    let (a, b) = futures::join!(engine.put_bytes(data.clone()), engine.put_bytes(data.clone()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.digest, b.digest);
    let stored: Vec<_> = engine.list().await.unwrap().into_iter().filter(|i| i.digest == digest).collect();
    assert_eq!(stored.len(), 1, "{}: one blob for one content", engine.name());
    assert_eq!(stored[0].size, data.len() as u64);
    let back = engine.read_to_vec(&a, ByteRange::full(data.len() as u64)).await.unwrap();
    assert!(back == data);
}

pub async fn abandoned_writes_leave_nothing(engine: &dyn BlobEngine) {
    let before: BTreeSet<_> = engine.list().await.unwrap().into_iter().map(|i| i.digest).collect();
    let data = pattern(2_500_000, 13);
    let mut aborted = engine.writer(None).await.unwrap();
    aborted.write(data.slice(..2_000_000)).await.unwrap();
    aborted.abort().await;
    let mut dropped = engine.writer(Some(data.len() as u64)).await.unwrap();
    dropped.write(data.slice(..1_200_000)).await.unwrap();
    drop(dropped);
    let after: BTreeSet<_> = engine.list().await.unwrap().into_iter().map(|i| i.digest).collect();
    assert_eq!(before, after, "{}: abandoned writes left a blob", engine.name());
    let missing = super::BlobRef { digest: digest_of(&data), size: data.len() as u64, locator: Vec::new() };
    assert_eq!(engine.stat(&missing).await.unwrap_or(None), None);
}

pub async fn delete_and_stat(engine: &dyn BlobEngine) {
    let data = pattern(70_000, 17);
    let blob = engine.put_bytes(data.clone()).await.unwrap();
    assert_eq!(engine.stat(&blob).await.unwrap(), Some(70_000));
    engine.delete(&blob).await.unwrap();
    assert_eq!(engine.stat(&blob).await.unwrap(), None);
    match engine.read(&blob, ByteRange::full(70_000)).await {
        Err(EngineError::NotFound(d)) => assert_eq!(d, blob.digest),
        Err(other) => panic!("{}: read of a deleted blob: {other}", engine.name()),
        Ok(_) => panic!("{}: read of a deleted blob succeeded", engine.name()),
    }
    // Deleting again is not an error.
    engine.delete(&blob).await.unwrap();
}

pub async fn list_reports_every_blob(engine: &dyn BlobEngine) {
    let mut expected = Vec::new();
    for i in 0..5u8 {
        let data = pattern(10_000 + i as usize * 300_000, 100 + i);
        let blob = engine.put_bytes(data).await.unwrap();
        expected.push((blob.digest, blob.size));
    }
    let listed = engine.list().await.unwrap();
    for (digest, size) in expected {
        let found = listed.iter().find(|i| i.digest == digest);
        assert_eq!(found.map(|i| i.size), Some(size), "{}: list misses {digest}", engine.name());
    }
}

pub async fn read_small_returns_blobs_in_order(engine: &dyn BlobEngine) {
    let mut blobs = Vec::new();
    let mut datas = Vec::new();
    for (i, len) in [0usize, 50, 4096, 70_000, 300_000].into_iter().enumerate() {
        let data = pattern(len, 200 + i as u8);
        blobs.push(engine.put_bytes(data.clone()).await.unwrap());
        datas.push(data);
    }
    // Out of order and with a repeat, as a batch of keys may ask.
    let order = [3, 0, 4, 1, 2, 1];
    let asked: Vec<_> = order.iter().map(|i| blobs[*i].clone()).collect();
    let got = engine.read_small(&asked).await.unwrap();
    assert_eq!(got.len(), order.len());
    for (bytes, i) in got.iter().zip(order) {
        assert!(*bytes == datas[i], "{}: read_small gave the wrong bytes for blob {i}", engine.name());
    }
    // The 70,000-byte blob: smaller ones may travel in their locators.
    engine.delete(&blobs[3]).await.unwrap();
    assert!(engine.read_small(&asked).await.is_err(), "{}: a missing blob must be an error", engine.name());
}
