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
        let mut held = self.inner.held.lock();
        if let Some(n) = held.get_mut(&self.digest) {
            if *n > 1 {
                *n -= 1;
            } else {
                held.remove(&self.digest);
                self.inner.released.notify_waiters();
            }
        }
    }
}
