//! Group commit for a RocksDB database: writers write without syncing, then
//! wait for one thread that syncs the write-ahead log for everyone who asked
//! since its last sync.
//!
//! RocksDB groups concurrent synced writes by itself, but every writer is a
//! thread parked inside RocksDB until its group's sync returns: a hundred
//! uploads mean a hundred blocking-pool threads and two wake-ups each. Here
//! a writer is a task: it writes (microseconds, on its own thread), asks for
//! a sync and awaits it, and the syncing thread wakes each waiting task once.
//!
//! A sync makes every write before it durable, so a waiter is answered by
//! the first sync that starts after it asked. The log is one file in write
//! order: a transaction that read another's unsynced write is durable only
//! once that write is too. A failed sync fails every waiter and every later
//! one: after a failed fsync the kernel may have dropped the unsynced pages,
//! so no later sync can be trusted to cover them.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use rocksdb::DB;
use tokio::sync::watch;

/// The syncing thread of one database; dropping it syncs what is pending
/// and stops the thread.
pub(crate) struct GroupCommit {
    shared: Arc<Shared>,
    synced: watch::Receiver<Synced>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    asked: Mutex<Asked>,
    wake: Condvar,
}

#[derive(Default)]
struct Asked {
    /// Tickets handed out so far: ticket n is answered by a sync that
    /// started after it was taken.
    tickets: u64,
    closing: bool,
}

#[derive(Clone, Default)]
struct Synced {
    /// Every ticket up to this one is durable.
    through: u64,
    /// The error of the first failed sync. `through` stops there: no
    /// later sync is trusted.
    failed: Option<String>,
}

impl GroupCommit {
    /// Starts the syncing thread of `db`, named after it.
    pub(crate) fn start(db: Arc<DB>, name: &str) -> std::io::Result<GroupCommit> {
        GroupCommit::with_sync(name, move || db.flush_wal(true).map_err(|e| e.to_string()))
    }

    /// Starts a syncing thread that makes writes durable with `sync`.
    fn with_sync(
        name: &str,
        sync: impl FnMut() -> Result<(), String> + Send + 'static,
    ) -> std::io::Result<GroupCommit> {
        let shared = Arc::new(Shared { asked: Mutex::new(Asked::default()), wake: Condvar::new() });
        let (tx, synced) = watch::channel(Synced::default());
        let thread = std::thread::Builder::new().name(format!("{name}-sync")).spawn({
            let shared = shared.clone();
            move || sync_loop(sync, &shared, &tx)
        })?;
        Ok(GroupCommit { shared, synced, thread: Some(thread) })
    }

    /// Returns once everything written before the call is durable; the
    /// error is the failed sync's.
    pub(crate) async fn durable(&self) -> Result<(), String> {
        let ticket = {
            let mut asked = self.shared.asked.lock();
            asked.tickets += 1;
            asked.tickets
        };
        self.shared.wake.notify_one();
        let mut synced = self.synced.clone();
        let done = synced
            .wait_for(|s| s.through >= ticket || s.failed.is_some())
            .await
            .map_err(|_| "the syncing thread stopped".to_string())?;
        // A sync that covered this write may have ended before a later
        // one failed: the write is durable all the same.
        match &done.failed {
            Some(e) if done.through < ticket => Err(e.clone()),
            _ => Ok(()),
        }
    }
}

fn sync_loop(mut sync: impl FnMut() -> Result<(), String>, shared: &Shared, tx: &watch::Sender<Synced>) {
    let mut through = 0;
    loop {
        let goal = {
            let mut asked = shared.asked.lock();
            while asked.tickets == through && !asked.closing {
                shared.wake.wait(&mut asked);
            }
            if asked.tickets == through {
                return;
            }
            asked.tickets
        };
        match sync() {
            Ok(()) => {
                through = goal;
                tx.send_modify(|s| {
                    if s.failed.is_none() {
                        s.through = goal;
                    }
                });
            }
            Err(e) => {
                tracing::error!("syncing the write-ahead log failed: {e}");
                tx.send_modify(|s| {
                    s.failed.get_or_insert(e);
                });
                // Later waiters read the failure at once; keep answering
                // tickets so none waits for a sync that will not come.
                through = goal;
            }
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.shared.asked.lock().closing = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    /// A stand-in sync that takes 5 ms and covers the writes made before it
    /// started, like an fsync of the log.
    fn slow_sync(
        written: Arc<AtomicU64>,
        covered: Arc<AtomicU64>,
        calls: Arc<AtomicU64>,
    ) -> impl FnMut() -> Result<(), String> {
        move || {
            let now = written.load(Ordering::SeqCst);
            calls.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            covered.store(now, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_is_answered_by_a_sync_that_covers_its_write_and_syncs_are_shared() {
        let (written, covered, calls): (Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicU64>) = Default::default();
        let group = Arc::new(
            GroupCommit::with_sync("test", slow_sync(written.clone(), covered.clone(), calls.clone())).unwrap(),
        );
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let (group, written, covered) = (group.clone(), written.clone(), covered.clone());
                tokio::spawn(async move {
                    let mine = written.fetch_add(1, Ordering::SeqCst) + 1;
                    group.durable().await.unwrap();
                    assert!(covered.load(Ordering::SeqCst) >= mine, "write {mine} answered before a sync covered it");
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let calls = calls.load(Ordering::SeqCst);
        assert!((1..100).contains(&calls), "200 waiters took {calls} syncs");
    }

    #[tokio::test]
    async fn a_failed_sync_fails_its_waiters_and_every_later_one() {
        let mut n = 0;
        let group = GroupCommit::with_sync("test", move || {
            n += 1;
            if n == 1 { Ok(()) } else { Err("disk on fire".to_string()) }
        })
        .unwrap();
        group.durable().await.unwrap();
        assert_eq!(group.durable().await.unwrap_err(), "disk on fire");
        assert_eq!(group.durable().await.unwrap_err(), "disk on fire", "a later sync is not trusted");
    }

    #[tokio::test]
    async fn a_write_a_sync_covered_is_durable_though_a_later_sync_fails() {
        let (results_tx, results) = std::sync::mpsc::channel::<Result<(), String>>();
        let results = Mutex::new(results);
        let group =
            GroupCommit::with_sync("test", move || results.lock().recv().unwrap_or(Err("no more".into()))).unwrap();
        let mut synced = group.synced.clone();
        let mut first = std::pin::pin!(group.durable());
        assert!(futures::poll!(first.as_mut()).is_pending(), "the first waiter took its ticket");
        results_tx.send(Ok(())).unwrap();
        synced.wait_for(|s| s.through >= 1).await.unwrap();
        // The first waiter has not looked yet when the next sync fails.
        let mut second = std::pin::pin!(group.durable());
        assert!(futures::poll!(second.as_mut()).is_pending());
        results_tx.send(Err("disk on fire".into())).unwrap();
        synced.wait_for(|s| s.failed.is_some()).await.unwrap();
        results_tx.send(Ok(())).unwrap();
        results_tx.send(Err("second fire".into())).unwrap();
        assert_eq!(first.await, Ok(()), "its sync covered it before the failure");
        assert_eq!(second.await.unwrap_err(), "disk on fire");
        assert_eq!(group.durable().await.unwrap_err(), "disk on fire", "a later success is not trusted");
        assert_eq!(group.durable().await.unwrap_err(), "disk on fire", "the first failure is the one kept");
    }

    #[tokio::test]
    async fn dropping_the_group_stops_its_thread_and_releases_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(DB::open_default(dir.path()).unwrap());
        let group = GroupCommit::start(db.clone(), "test").unwrap();
        db.put(b"k", b"v").unwrap();
        group.durable().await.unwrap();
        drop(group);
        assert_eq!(Arc::strong_count(&db), 1, "the thread let go of the database");
    }
}
