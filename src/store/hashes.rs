//! The hashes of a body as it streams in: SHA-256 names the content, MD5 is
//! the S3 ETag.
//!
//! MD5 costs about three times SHA-256 on a CPU with SHA extensions, so one
//! large upload would keep one core busy hashing while the other idles.
//! Past [`OFFLOAD`] bytes its MD5 moves to a thread of its own and takes the
//! rest of the body from a short queue: the two hashes run on two cores,
//! and the queue's bound slows the upload to the slower of them. Smaller
//! bodies hash on the request's task, where a hand-off would cost more than
//! it saves, and so do bodies arriving while every core already has an MD5
//! thread: then the cores are busy anyway, and the threads stay bounded.
//! (The threads are not the blocking pool's: an MD5 thread waits for its
//! upload, which may wait for a blocking-pool write, so sharing the pool
//! could fill it with waiters.)

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use md5::Digest as _;
use tokio::sync::{mpsc, oneshot};

use super::{Result, StoreError};
use crate::engine::Digest;

/// Bytes after which MD5 moves to a thread of its own.
const OFFLOAD: u64 = 1024 * 1024;
/// Chunks queued for the MD5 thread, at most.
const QUEUE: usize = 16;

enum Md5 {
    Here(md5::Md5),
    Away { queue: mpsc::Sender<Bytes>, done: oneshot::Receiver<[u8; 16]> },
}

/// MD5 threads running now, and how many may.
static THREADS: AtomicUsize = AtomicUsize::new(0);
static CORES: LazyLock<usize> = LazyLock::new(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

/// A place among the MD5 threads, given back when dropped.
struct Slot;

impl Slot {
    fn take() -> Option<Slot> {
        THREADS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < *CORES).then_some(n + 1)).ok().map(|_| Slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        THREADS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Hashes the rest of a body on a thread of its own, starting from `md5`;
/// `None` if no thread may or can start.
fn offload(md5: &md5::Md5) -> Option<Md5> {
    let slot = Slot::take()?;
    let (queue, mut chunks) = mpsc::channel::<Bytes>(QUEUE);
    let (answer, done) = oneshot::channel();
    let mut md5 = md5.clone();
    std::thread::Builder::new()
        .name("depot-md5".into())
        .spawn(move || {
            let _slot = slot;
            while let Some(chunk) = chunks.blocking_recv() {
                md5.update(&chunk);
            }
            let _ = answer.send(md5.finalize().into());
        })
        .ok()?;
    Some(Md5::Away { queue, done })
}

/// SHA-256, MD5 and length of a body, chunk by chunk.
pub(super) struct BodyHashes {
    sha: sha2::Sha256,
    md5: Md5,
    size: u64,
}

impl BodyHashes {
    pub(super) fn new() -> BodyHashes {
        BodyHashes { sha: sha2::Sha256::new(), md5: Md5::Here(md5::Md5::new()), size: 0 }
    }

    pub(super) async fn update(&mut self, chunk: &Bytes) {
        self.sha.update(chunk);
        self.size += chunk.len() as u64;
        match &mut self.md5 {
            Md5::Here(md5) => {
                md5.update(chunk);
                let crossed = self.size > OFFLOAD && self.size - chunk.len() as u64 <= OFFLOAD;
                if crossed && let Some(away) = offload(md5) {
                    self.md5 = away;
                }
            }
            // The thread only ends when the queue closes: a failed send
            // means it died, and `finish` reports that.
            Md5::Away { queue, .. } => drop(queue.send(chunk.clone()).await),
        }
    }

    /// SHA-256, MD5 and length of everything given to [`BodyHashes::update`].
    pub(super) async fn finish(self) -> Result<(Digest, [u8; 16], u64)> {
        let sha = Digest(self.sha.finalize().into());
        let md5 = match self.md5 {
            Md5::Here(md5) => md5.finalize().into(),
            Md5::Away { queue, done } => {
                drop(queue);
                done.await.map_err(|_| StoreError::Internal("the MD5 thread died".into()))?
            }
        };
        Ok((sha, md5, self.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bodies either side of the hand-off hash as one pass over the bytes.
    #[tokio::test]
    async fn offloaded_md5_matches_one_pass() {
        let body: Vec<u8> = (0..3 * OFFLOAD as usize + 12_345).map(|i| (i * 31 % 251) as u8).collect();
        for len in [0, 1, OFFLOAD as usize, OFFLOAD as usize + 1, body.len()] {
            let mut hashes = BodyHashes::new();
            for chunk in body[..len].chunks(64 * 1024 + 7) {
                hashes.update(&Bytes::copy_from_slice(chunk)).await;
            }
            let (sha, md5, size) = hashes.finish().await.expect("hashes");
            assert_eq!(size, len as u64);
            assert_eq!(sha.0, <[u8; 32]>::from(sha2::Sha256::digest(&body[..len])), "sha256 of {len} bytes");
            assert_eq!(md5, <[u8; 16]>::from(md5::Md5::digest(&body[..len])), "md5 of {len} bytes");
        }
    }
}
