//! Keeps the collector and writers of the same content apart.
//!
//! A writer holds a guard on its blob's digest from the moment it makes the
//! bytes durable until the catalog has the reference, and a reader of a
//! large object while it streams; the collector takes a guard only when no
//! one holds one, and writers and readers wait while the collector deletes.
//! So the collector never deletes bytes that a writer has just written (or
//! found already stored) and is about to reference, nor bytes being sent.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::engine::Digest;

#[derive(Default)]
pub(super) struct BlobGuards {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Writers holding a digest (> 0), or -1 while the collector does.
    held: Mutex<HashMap<Digest, i64>>,
    released: Notify,
}

/// Released when dropped.
pub(super) struct Guard {
    inner: Arc<Inner>,
    digest: Digest,
}

impl BlobGuards {
    /// Waits until the collector is not deleting `digest`, then holds it.
    pub async fn writing(&self, digest: Digest) -> Guard {
        loop {
            let wait = self.inner.released.notified();
            {
                let mut held = self.inner.held.lock();
                let n = held.entry(digest).or_insert(0);
                if *n >= 0 {
                    *n += 1;
                    return Guard { inner: self.inner.clone(), digest };
                }
            }
            wait.await;
        }
    }

    /// Holds `digest` while its bytes are read: the collector leaves them
    /// alone meanwhile, as it does for a writer.
    pub async fn reading(&self, digest: Digest) -> Guard {
        self.writing(digest).await
    }

    /// Holds each of `digests` while they are read, as [`Self::reading`]
    /// does one, under one lock for them all but those the collector is
    /// deleting, which wait for it one by one.
    pub async fn reading_all(&self, digests: &[Digest]) -> Guards {
        let mut busy = Vec::new();
        let mut taken = Vec::with_capacity(digests.len());
        {
            let mut held = self.inner.held.lock();
            for digest in digests {
                let n = held.entry(*digest).or_insert(0);
                if *n >= 0 {
                    *n += 1;
                    taken.push(*digest);
                } else {
                    busy.push(*digest);
                }
            }
        }
        // Made before any wait: dropped while waiting, the call lets go of
        // what it took.
        let mut guards = Guards { inner: self.inner.clone(), digests: taken, waited: Vec::with_capacity(busy.len()) };
        for digest in busy {
            guards.waited.push(self.writing(digest).await);
        }
        guards
    }

    /// Holds `digest` for the collector, unless a writer holds it.
    pub fn collecting(&self, digest: Digest) -> Option<Guard> {
        let mut held = self.inner.held.lock();
        if held.contains_key(&digest) {
            return None;
        }
        held.insert(digest, -1);
        Some(Guard { inner: self.inner.clone(), digest })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if release(&mut self.inner.held.lock(), &self.digest) {
            self.inner.released.notify_waiters();
        }
    }
}

/// Guards on many digests ([`BlobGuards::reading_all`]), released together
/// when dropped.
pub(super) struct Guards {
    inner: Arc<Inner>,
    digests: Vec<Digest>,
    /// Those taken after the collector's delete, held as one guard each.
    waited: Vec<Guard>,
}

impl Drop for Guards {
    fn drop(&mut self) {
        let mut held = self.inner.held.lock();
        let mut freed = false;
        for digest in &self.digests {
            freed |= release(&mut held, digest);
        }
        if freed {
            self.inner.released.notify_waiters();
        }
    }
}

/// Lets go of one hold on `digest`; whether it was the last.
fn release(held: &mut HashMap<Digest, i64>, digest: &Digest) -> bool {
    match held.get_mut(digest) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            held.remove(digest);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many digests held at once keep the collector off each of them until
    /// the hold goes, and one the collector holds is waited for.
    #[tokio::test]
    async fn many_digests_are_held_and_released_together() {
        let guards = BlobGuards::default();
        let (a, b, c) = (Digest([1; 32]), Digest([2; 32]), Digest([3; 32]));
        let single = guards.reading(a).await;
        let all = guards.reading_all(&[a, b]).await;
        assert!(guards.collecting(a).is_none() && guards.collecting(b).is_none());
        drop(single);
        assert!(guards.collecting(a).is_none(), "still held by the many");
        drop(all);
        assert!(guards.collecting(a).is_some() && guards.collecting(b).is_some());
        let collected = guards.collecting(c).unwrap();
        let waiting = tokio::spawn({
            let guards = BlobGuards { inner: guards.inner.clone() };
            async move { guards.reading_all(&[c]).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "waits for the collector's delete");
        drop(collected);
        let held = waiting.await.unwrap();
        assert!(guards.collecting(c).is_none());
        drop(held);
        assert!(guards.collecting(c).is_some());
    }
}
