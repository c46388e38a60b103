//! Bodies of small blobs read lately, by digest: once its object record is
//! found, a hot object is answered from memory, without its blob record,
//! an engine read or a copy, as a hot file is answered from the page cache.
//!
//! A digest names its content, so an entry is stale only when the bytes it
//! was read from were damaged (the cache does not hash what it keeps): an
//! upload of the digest, which may put good bytes in their place, drops
//! it. Verification and backups read the engine itself, never this cache.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;

use crate::engine::{ByteStream, Digest, EngineError};

/// Largest blob kept: the engine's small side holds blobs up to the inline
/// threshold (256 KiB by default), and larger files are streamed.
pub const LARGEST: u64 = 256 * 1024;
/// Bytes of bodies kept, as much as RocksDB's default block cache.
const CAPACITY: u64 = 32 << 20;
/// What an entry costs besides its body: key, handle and bookkeeping.
const ENTRY_OVERHEAD: u64 = 128;

/// An entry's cost: its body and [`ENTRY_OVERHEAD`].
#[derive(Clone)]
struct BodyWeight;

impl quick_cache::Weighter<Digest, Bytes> for BodyWeight {
    fn weight(&self, _: &Digest, body: &Bytes) -> u64 {
        ENTRY_OVERHEAD + body.len() as u64
    }
}

pub struct HotBlobs {
    bodies: quick_cache::sync::Cache<Digest, Bytes, BodyWeight>,
    hits: AtomicU64,
    misses: AtomicU64,
    /// Counts [`HotBlobs::forget`]s, by a stripe of the digest: a read of
    /// a digest that began before one may have read the bytes it forgot,
    /// and does not keep them.
    forgets: Box<[AtomicU64]>,
}

/// Stripes of [`HotBlobs::forgets`]: reads of other contents are rarely
/// kept from the cache by an upload.
const FORGET_STRIPES: usize = 1024;

fn stripe(digest: &Digest) -> usize {
    usize::from(u16::from_le_bytes([digest.0[0], digest.0[1]])) % FORGET_STRIPES
}

/// When a read for [`HotBlobs::fill`] began, as [`HotBlobs::read_begins`]
/// tells it.
#[derive(Clone, Copy)]
pub struct ReadBegan(u64);

/// What the cache did since start, and what it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HotStats {
    /// Reads answered from memory.
    pub hits: u64,
    /// Reads of small blobs that went to the engine.
    pub misses: u64,
    /// Bytes kept, bodies and their bookkeeping.
    pub bytes: u64,
}

impl Default for HotBlobs {
    fn default() -> Self {
        HotBlobs::with_capacity(CAPACITY)
    }
}

impl HotBlobs {
    pub fn with_capacity(bytes: u64) -> HotBlobs {
        // Sized for bodies of some 4 KiB on average. Each shard of the
        // cache holds an equal share of `bytes` and refuses a body larger
        // than its share: by default there are four per core, which on a
        // large machine would refuse the largest bodies. A shard here holds
        // eight of them.
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity((bytes / 4096) as usize)
            .weight_capacity(bytes)
            .shards((bytes / (8 * LARGEST)).clamp(1, 64) as usize)
            .build()
            .expect("the cache's options are complete");
        let bodies =
            quick_cache::sync::Cache::with_options(options, BodyWeight, Default::default(), Default::default());
        let forgets = (0..FORGET_STRIPES).map(|_| AtomicU64::new(0)).collect();
        HotBlobs { bodies, hits: AtomicU64::new(0), misses: AtomicU64::new(0), forgets }
    }

    pub fn get(&self, digest: &Digest) -> Option<Bytes> {
        let body = self.bodies.get(digest);
        if body.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        body
    }

    /// Drops the body of `digest`, if kept, and keeps none that a read
    /// begun before now brings.
    pub fn forget(&self, digest: &Digest) {
        self.forgets[stripe(digest)].fetch_add(1, Ordering::SeqCst);
        self.bodies.remove(digest);
    }

    /// To call before opening the read of `digest` whose bytes go to
    /// [`HotBlobs::fill`].
    pub fn read_begins(&self, digest: &Digest) -> ReadBegan {
        ReadBegan(self.forgets[stripe(digest)].load(Ordering::SeqCst))
    }

    pub fn stats(&self) -> HotStats {
        HotStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes: self.bodies.weight(),
        }
    }

    /// Reads a whole blob of `size` bytes from `stream` and keeps it, in a
    /// buffer of its own: a chunk an engine hands over may be a view into a
    /// larger buffer, which a kept view would hold on to unweighed. Not
    /// kept if a body was forgotten since the read `began`.
    pub async fn fill(
        &self,
        digest: Digest,
        size: u64,
        began: ReadBegan,
        mut stream: ByteStream,
    ) -> Result<Bytes, EngineError> {
        self.misses.fetch_add(1, Ordering::Relaxed);
        let short = |read: usize| EngineError::other("store", format!("blob {digest}: read {read} of {size} bytes"));
        let mut body = BytesMut::with_capacity(size.min(LARGEST) as usize);
        while let Some(chunk) = stream.try_next().await? {
            if (body.len() + chunk.len()) as u64 > size {
                return Err(short(body.len() + chunk.len()));
            }
            body.extend_from_slice(&chunk);
        }
        if body.len() as u64 != size {
            return Err(short(body.len()));
        }
        let body = body.freeze();
        // Kept, then taken out again if a forget came meanwhile: a forget
        // between a look and the insert would otherwise be missed.
        let forgets = &self.forgets[stripe(&digest)];
        if forgets.load(Ordering::SeqCst) == began.0 {
            self.bodies.insert(digest, body.clone());
            if forgets.load(Ordering::SeqCst) != began.0 {
                self.bodies.remove(&digest);
            }
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(chunks: &[&'static [u8]]) -> ByteStream {
        let chunks: Vec<Result<Bytes, EngineError>> = chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
        Box::pin(futures::stream::iter(chunks))
    }

    #[tokio::test]
    async fn a_blob_read_in_pieces_is_kept_whole() {
        let hot = HotBlobs::default();
        let d = Digest([1; 32]);
        let body = hot.fill(d, 6, hot.read_begins(&d), stream(&[b"ab", b"", b"cd", b"ef"])).await.unwrap();
        assert_eq!(&body[..], b"abcdef");
        assert_eq!(hot.get(&d).as_deref(), Some(&b"abcdef"[..]));
        assert!(hot.get(&Digest([9; 32])).is_none());
        assert_eq!(hot.stats(), HotStats { hits: 1, misses: 1, bytes: 6 + ENTRY_OVERHEAD });
    }

    #[tokio::test]
    async fn a_short_long_or_failed_read_keeps_nothing() {
        let hot = HotBlobs::default();
        let d = Digest([2; 32]);
        let err = hot.fill(d, 7, hot.read_begins(&d), stream(&[b"abc", b"def"])).await.unwrap_err();
        assert!(err.to_string().contains("read 6 of 7 bytes"), "{err}");
        let err = hot.fill(d, 5, hot.read_begins(&d), stream(&[b"abc", b"def"])).await.unwrap_err();
        assert!(err.to_string().contains("read 6 of 5 bytes"), "{err}");
        let failing: ByteStream = Box::pin(futures::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err(EngineError::other("test", "disk gone")),
        ]));
        assert!(hot.fill(d, 3, hot.read_begins(&d), failing).await.is_err());
        assert!(hot.get(&d).is_none());
    }

    /// A read that began before a forget may have read what it forgot.
    #[tokio::test]
    async fn a_read_begun_before_a_forget_keeps_nothing() {
        let hot = HotBlobs::default();
        let d = Digest([3; 32]);
        let began = hot.read_begins(&d);
        hot.forget(&d);
        assert_eq!(&hot.fill(d, 3, began, stream(&[b"old"])).await.unwrap()[..], b"old");
        assert!(hot.get(&d).is_none());
        hot.fill(d, 3, hot.read_begins(&d), stream(&[b"new"])).await.unwrap();
        assert_eq!(hot.get(&d).as_deref(), Some(&b"new"[..]));
        // A forget of another content lets the read keep what it read.
        let other = Digest([200; 32]);
        assert_ne!(stripe(&other), stripe(&d));
        let began = hot.read_begins(&other);
        hot.forget(&d);
        hot.fill(other, 3, began, stream(&[b"kep"])).await.unwrap();
        assert!(hot.get(&other).is_some());
    }

    #[tokio::test]
    async fn the_capacity_bounds_what_is_kept() {
        let hot = HotBlobs::with_capacity(64 * 1024);
        for i in 0..64u8 {
            let body: &'static [u8] = Box::leak(vec![i; 4096].into_boxed_slice());
            hot.fill(Digest([i; 32]), 4096, hot.read_begins(&Digest([i; 32])), stream(&[body])).await.unwrap();
        }
        assert!(hot.bodies.weight() <= 64 * 1024, "{} bytes kept", hot.bodies.weight());
        assert!(hot.bodies.len() < 64);
    }

    /// The largest bodies are kept whatever the machine's cores: a shard
    /// of the cache refuses a body larger than its share.
    #[tokio::test]
    async fn the_largest_bodies_are_kept() {
        let hot = HotBlobs::default();
        let body: &'static [u8] = Box::leak(vec![7; LARGEST as usize].into_boxed_slice());
        for i in 0..8u8 {
            let d = Digest([i; 32]);
            hot.fill(d, LARGEST, hot.read_begins(&d), stream(&[body])).await.unwrap();
            assert!(hot.get(&d).is_some(), "a body of {LARGEST} bytes was not kept");
        }
    }
}
