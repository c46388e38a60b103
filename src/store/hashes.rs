//! The hashes of a body as it streams in: SHA-256 names the content, MD5 is
//! the S3 ETag.
//!
//! MD5 is the dearer of the two (SHA-256 runs on the CPU's SHA extensions),
//! and one stream of it cannot be split: every 64-byte block depends on the
//! block before. Blocks of different uploads are independent, though, and
//! the CPU's vector lanes hash up to 16 of them in one pass (AVX-512; 8 with
//! AVX2). So past [`OFFLOAD`] bytes an upload's MD5 moves to one shared
//! thread, which hashes a chunk of every large upload in flight at once: many
//! concurrent uploads cost little more CPU than one, and a lone large upload
//! still gets a core of its own for its MD5 while its SHA-256 runs on the
//! request's task. Smaller bodies hash on the request's task, where the
//! hand-off would cost more than it saves.
//!
//! The thread takes chunks from one bounded queue and holds at most [`HELD`]
//! bytes past it, so memory stays bounded: when it falls behind, uploads
//! wait for it, and their chunks pile up for it, which fills its lanes.
//! (It is not a blocking-pool thread: uploads wait for it, and it must never
//! wait behind them.)
//!
//! The lanes are `md5-many`'s: young (0.1, alpha), but the one crate that
//! carries several incremental MD5 streams through one pass; the tests
//! check its digests against `md-5`'s.

use std::collections::VecDeque;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use md5_many::{Md5Many, Md5State};
use sha2::Digest as _;
use tokio::sync::{mpsc, oneshot};

use super::{Result, StoreError};
use crate::engine::Digest;

/// Bytes after which MD5 moves to the shared thread.
const OFFLOAD: u64 = 1024 * 1024;
/// Chunks queued for the shared thread, at most.
const QUEUE: usize = 32;
/// Bytes the shared thread takes off its queue before hashing them, at most.
const HELD: usize = 4 * 1024 * 1024;
/// MD5 hashes 64-byte blocks.
const BLOCK: usize = 64;

/// What an upload tells the shared thread, in its order.
enum Message {
    Open { id: u64, state: Md5State, answer: oneshot::Sender<[u8; 16]> },
    Chunk(u64, Bytes),
    Close(u64),
}

/// The queue of the shared thread; `None` if it could not start.
static LANES: LazyLock<Option<mpsc::Sender<Message>>> = LazyLock::new(|| {
    let (queue, messages) = mpsc::channel(QUEUE);
    std::thread::Builder::new().name("depot-md5".into()).spawn(move || hash_in_lanes(messages)).ok()?;
    Some(queue)
});
static NEXT_STREAM: AtomicU64 = AtomicU64::new(0);

/// One upload's MD5 on the shared thread.
struct Stream {
    id: u64,
    /// Always of a whole number of blocks, so streams can share a pass.
    state: Md5State,
    chunks: VecDeque<Bytes>,
    /// Bytes short of a whole block, waiting for the next chunk.
    carry: Vec<u8>,
    closed: bool,
    /// Dropped on the upload's side when the upload is: then the stream goes.
    answer: oneshot::Sender<[u8; 16]>,
}

impl Stream {
    /// Makes the first chunk start on a block and hold one, folding bytes
    /// short of a block into `carry` (hashed once it is a block); returns
    /// the bytes taken off the chunks.
    fn align(&mut self) -> usize {
        let mut taken = 0;
        while let Some(front) = self.chunks.front_mut() {
            if self.carry.is_empty() && front.len() >= BLOCK {
                break;
            }
            let n = (BLOCK - self.carry.len()).min(front.len());
            self.carry.extend_from_slice(&front.split_to(n));
            taken += n;
            if front.is_empty() {
                self.chunks.pop_front();
            }
            if self.carry.len() == BLOCK {
                self.state.update(&self.carry);
                self.carry.clear();
            }
        }
        taken
    }

    /// Whole blocks at the head of the first chunk, after [`Stream::align`].
    fn blocks_ready(&self) -> usize {
        self.chunks.front().map_or(0, |c| c.len() / BLOCK * BLOCK)
    }

    fn queued(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }

    /// Takes `len` bytes, at most [`Stream::blocks_ready`], off the first chunk.
    fn take_blocks(&mut self, len: usize) -> Bytes {
        let Some(front) = self.chunks.front_mut() else { return Bytes::new() };
        let blocks = front.split_to(len);
        if front.is_empty() {
            self.chunks.pop_front();
        }
        blocks
    }

    fn finish(mut self) {
        self.state.update(&self.carry);
        let _ = self.answer.send(self.state.finalize());
    }
}

/// The shared thread: takes what uploads send and, once a chunk of every
/// upload (or of as many as there are lanes) is in, hashes them together;
/// until the queue closes.
fn hash_in_lanes(mut messages: mpsc::Receiver<Message>) {
    let md5 = Md5Many::new();
    let mut streams: Vec<Stream> = Vec::new();
    let mut held = 0;
    loop {
        while held < HELD
            && let Ok(message) = messages.try_recv()
        {
            take(&mut streams, message, &mut held);
        }
        settle(&mut streams, &mut held);
        let ready = streams.iter().filter(|s| !s.chunks.is_empty()).count();
        let due = ready >= streams.len().min(md5.lanes()) || held >= HELD / 2 || streams.iter().any(|s| s.closed);
        if ready > 0 && due {
            held -= hash_round(&md5, &mut streams);
        } else {
            let Some(message) = messages.blocking_recv() else { return };
            take(&mut streams, message, &mut held);
        }
    }
}

/// Answers the streams closed and hashed, and drops those whose upload is
/// gone.
fn settle(streams: &mut Vec<Stream>, held: &mut usize) {
    let mut i = 0;
    while i < streams.len() {
        let s = &streams[i];
        if s.answer.is_closed() {
            *held -= s.queued();
            streams.swap_remove(i);
        } else if s.closed && s.chunks.is_empty() {
            streams.swap_remove(i).finish();
        } else {
            i += 1;
        }
    }
}

/// Hashes the blocks at the head of every stream's first chunk, in one pass
/// of as many streams as there are lanes (those with the most queued when
/// there are more); returns the bytes taken off the chunks.
///
/// A pass hashes as many bytes of each stream, and the fast kernels take 8
/// or 16 streams: the lanes left over hash a copy of one stream's bytes and
/// are thrown away. That costs less than the general kernel, and than one
/// stream after another, from 5 streams up; with fewer, each hashes alone.
fn hash_round(md5: &Md5Many, streams: &mut [Stream]) -> usize {
    let mut taken: usize = streams.iter_mut().map(Stream::align).sum();
    let mut ready: Vec<usize> = (0..streams.len()).filter(|&i| streams[i].blocks_ready() > 0).collect();
    if ready.len() > md5.lanes() {
        // The furthest behind first, so that none waits for long.
        ready.sort_unstable_by_key(|&i| std::cmp::Reverse(streams[i].queued()));
        ready.truncate(md5.lanes());
    }
    if ready.len() < 5 {
        for i in ready {
            let s = &mut streams[i];
            let blocks = s.take_blocks(s.blocks_ready());
            s.state.update(&blocks);
            taken += blocks.len();
        }
        return taken;
    }
    let len = ready.iter().map(|&i| streams[i].blocks_ready()).min().unwrap_or(0);
    let width = if ready.len() <= 8 { 8 } else { md5.lanes() };
    let blocks: Vec<Bytes> = ready.iter().map(|&i| streams[i].take_blocks(len)).collect();
    let mut states: Vec<Md5State> = ready.iter().map(|&i| streams[i].state).collect();
    states.resize(width, Md5State::new());
    let mut inputs: Vec<&[u8]> = blocks.iter().map(|b| b.as_ref()).collect();
    inputs.resize(width, &blocks[0]);
    md5.update_many(&mut states, &inputs);
    for (&i, state) in ready.iter().zip(states) {
        streams[i].state = state;
    }
    taken + len * ready.len()
}

fn take(streams: &mut Vec<Stream>, message: Message, held: &mut usize) {
    fn find(streams: &mut [Stream], id: u64) -> Option<&mut Stream> {
        streams.iter_mut().find(|s| s.id == id)
    }
    match message {
        Message::Open { id, state, answer } => {
            streams.push(Stream { id, state, chunks: VecDeque::new(), carry: Vec::new(), closed: false, answer })
        }
        Message::Chunk(id, chunk) => {
            if let Some(s) = find(streams, id) {
                *held += chunk.len();
                s.chunks.push_back(chunk);
            }
        }
        Message::Close(id) => {
            if let Some(s) = find(streams, id) {
                s.closed = true;
            }
        }
    }
}

/// Opens a stream on the shared thread from `state`, of a whole number of
/// blocks, and gives it `rest`; `None` if the thread is gone.
async fn hand_over(queue: &mpsc::Sender<Message>, state: Md5State, rest: Bytes) -> Option<Md5> {
    let id = NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
    let (answer, done) = oneshot::channel();
    queue.send(Message::Open { id, state, answer }).await.ok()?;
    if !rest.is_empty() {
        queue.send(Message::Chunk(id, rest)).await.ok()?;
    }
    Some(Md5::Away { id, queue: queue.clone(), done })
}

enum Md5 {
    Here(Md5State),
    Away { id: u64, queue: mpsc::Sender<Message>, done: oneshot::Receiver<[u8; 16]> },
}

/// SHA-256, MD5 and length of a body, chunk by chunk.
pub(super) struct BodyHashes {
    sha: sha2::Sha256,
    md5: Md5,
    size: u64,
}

impl BodyHashes {
    pub(super) fn new() -> BodyHashes {
        BodyHashes { sha: sha2::Sha256::new(), md5: Md5::Here(Md5State::new()), size: 0 }
    }

    pub(super) async fn update(&mut self, chunk: &Bytes) {
        self.sha.update(chunk);
        self.size += chunk.len() as u64;
        match &mut self.md5 {
            Md5::Here(md5) => {
                // The shared thread starts on a whole block: hash up to one here.
                let to_block = (BLOCK - (md5.bytes_hashed() % BLOCK as u64) as usize) % BLOCK;
                // Small bodies never reach (or start) the shared thread.
                if self.size > OFFLOAD
                    && to_block <= chunk.len()
                    && let Some(queue) = LANES.as_ref().filter(|q| !q.is_closed())
                {
                    md5.update(&chunk[..to_block]);
                    let rest = chunk.slice(to_block..);
                    if let Some(away) = hand_over(queue, *md5, rest.clone()).await {
                        self.md5 = away;
                    } else {
                        md5.update(&rest);
                    }
                } else {
                    md5.update(chunk);
                }
            }
            // The thread only ends if it panicked: `finish` reports that.
            Md5::Away { id, queue, .. } => drop(queue.send(Message::Chunk(*id, chunk.clone())).await),
        }
    }

    /// SHA-256, MD5 and length of everything given to [`BodyHashes::update`].
    pub(super) async fn finish(self) -> Result<(Digest, [u8; 16], u64)> {
        let sha = Digest(self.sha.finalize().into());
        let md5 = match self.md5 {
            Md5::Here(md5) => md5.finalize(),
            Md5::Away { id, queue, done } => {
                let _ = queue.send(Message::Close(id)).await;
                done.await.map_err(|_| StoreError::Internal("the MD5 thread died".into()))?
            }
        };
        Ok((sha, md5, self.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bodies either side of the hand-off, in many chunks or one, hash as
    /// one pass over the bytes.
    #[tokio::test]
    async fn offloaded_md5_matches_one_pass() {
        let body: Vec<u8> = (0..3 * OFFLOAD as usize + 12_345).map(|i| (i * 31 % 251) as u8).collect();
        let lens = [0, 1, OFFLOAD as usize, OFFLOAD as usize + 1, body.len()];
        for (len, chunk_size) in lens.into_iter().flat_map(|len| [(len, 64 * 1024 + 7), (len, body.len())]) {
            let mut hashes = BodyHashes::new();
            for chunk in body[..len].chunks(chunk_size) {
                hashes.update(&Bytes::copy_from_slice(chunk)).await;
            }
            let (sha, md5, size) = hashes.finish().await.expect("hashes");
            assert_eq!(size, len as u64);
            assert_eq!(sha.0, <[u8; 32]>::from(sha2::Sha256::digest(&body[..len])), "sha256 of {len} bytes");
            assert_eq!(md5, <[u8; 16]>::from(md5::Md5::digest(&body[..len])), "md5 of {len} bytes");
        }
    }

    fn md5_of(body: &[u8]) -> [u8; 16] {
        <md5::Md5 as md5::Digest>::digest(body).into()
    }

    /// A body and the chunks it arrives in: mostly large and uneven, some
    /// after the first shorter than a block.
    fn body_in_chunks(seed: u64, len: usize) -> (Vec<u8>, Vec<Bytes>) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let body: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let mut chunks = Vec::new();
        let mut at = 0;
        while at < len {
            let n =
                if at > 0 && rng.random_bool(0.2) { rng.random_range(1..BLOCK) } else { rng.random_range(1..100_000) };
            let end = (at + n).min(len);
            chunks.push(Bytes::copy_from_slice(&body[at..end]));
            at = end;
        }
        (body, chunks)
    }

    /// Passes over any number of streams, whose chunks do not end on blocks,
    /// give each stream its own MD5; from 5 streams up a pass takes as many
    /// bytes of each, up to the number of lanes.
    #[test]
    fn streams_hashed_in_shared_passes_get_their_own_md5() {
        let md5 = Md5Many::new();
        for count in [1, 3, 5, 8, 9, 16, 20] {
            let mut bodies = Vec::new();
            let mut streams = Vec::new();
            let mut answers = Vec::new();
            for i in 0..count {
                let (body, chunks) = body_in_chunks(count as u64 * 100 + i as u64, 300_000 + i * 1_001);
                let (answer, done) = oneshot::channel();
                let (state, carry, closed) = (Md5State::new(), Vec::new(), true);
                streams.push(Stream { id: i as u64, state, chunks: chunks.into(), carry, closed, answer });
                bodies.push(body);
                answers.push(done);
            }
            let total: usize = bodies.iter().map(Vec::len).sum();
            let mut taken = hash_round(&md5, &mut streams);
            if count >= 5 && md5.lanes() >= 8 {
                // One pass: the same whole blocks of as many streams as
                // there are lanes, nothing of the others.
                let hashed: Vec<u64> = streams.iter().map(|s| s.state.bytes_hashed()).collect();
                let passed: Vec<u64> = hashed.iter().copied().filter(|&n| n > 0).collect();
                assert_eq!(passed.len(), count.min(md5.lanes()), "{count} streams: {hashed:?}");
                assert!(passed.iter().all(|&n| n == passed[0] && n % BLOCK as u64 == 0), "{count} streams: {hashed:?}");
            }
            while streams.iter().any(|s| !s.chunks.is_empty()) {
                taken += hash_round(&md5, &mut streams);
            }
            assert_eq!(taken, total, "{count} streams: every byte taken once");
            for s in streams {
                s.finish();
            }
            for (i, (body, mut done)) in bodies.iter().zip(answers).enumerate() {
                assert_eq!(done.try_recv().expect("answered"), md5_of(body), "stream {i} of {count}");
            }
        }
    }

    /// Concurrent uploads, some abandoned half way, through the shared thread.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_uploads_each_get_their_own_md5() {
        let mut tasks = Vec::new();
        for i in 0..24u64 {
            tasks.push(tokio::spawn(async move {
                let (body, chunks) = body_in_chunks(i, 2 * OFFLOAD as usize + (i as usize * 7_919));
                let mut hashes = BodyHashes::new();
                for (n, chunk) in chunks.iter().enumerate() {
                    hashes.update(chunk).await;
                    if i % 6 == 5 && n == chunks.len() / 2 {
                        return None;
                    }
                }
                let (_, md5, size) = hashes.finish().await.expect("hashes");
                assert_eq!(size, body.len() as u64);
                Some((md5, md5_of(&body)))
            }));
        }
        let mut finished = 0;
        for task in tasks {
            if let Some((got, want)) = task.await.expect("task") {
                assert_eq!(got, want);
                finished += 1;
            }
        }
        assert_eq!(finished, 20);
    }

    /// A stream closed while the thread hashes another, with nothing left to
    /// hash, is answered all the same: the thread does not wait for more.
    #[tokio::test]
    async fn a_stream_closed_while_another_hashes_is_answered() {
        let (queue, messages) = mpsc::channel(QUEUE);
        let thread = std::thread::spawn(move || hash_in_lanes(messages));
        let open = |id| {
            let (answer, done) = oneshot::channel();
            (Message::Open { id, state: Md5State::new(), answer }, done)
        };
        let (small, big) = (Bytes::from(vec![1u8; 1000]), Bytes::from(vec![2u8; 64 << 20]));
        let (message, small_done) = open(0);
        queue.send(message).await.expect("open");
        queue.send(Message::Chunk(0, small.clone())).await.expect("chunk");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (message, big_done) = open(1);
        queue.send(message).await.expect("open");
        queue.send(Message::Chunk(1, big.clone())).await.expect("chunk");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        queue.send(Message::Close(0)).await.expect("close");
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), small_done).await;
        assert_eq!(answer.expect("answered in time").expect("answer"), md5_of(&small));
        queue.send(Message::Close(1)).await.expect("close");
        assert_eq!(big_done.await.expect("answer"), md5_of(&big));
        drop(queue);
        thread.join().expect("the thread ends when its queue closes");
    }
}
