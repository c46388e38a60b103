//! `postgres`: blobs as rows of chunks in PostgreSQL, so that several depot
//! nodes can share one store of bytes (the seed's SQL Server BLOBs, without
//! its timeouts and its out-of-memory reads).
//!
//! Tables, created at start-up when missing (under an advisory lock, so that
//! nodes starting together do not race each other's DDL):
//!
//! | table | one row per | columns |
//! |---|---|---|
//! | `depot_engine_blobs` | stored blob | `digest` (key), `id`, `size`, `chunk_size`, `modified` |
//! | `depot_engine_chunks` | chunk of a blob | `id`, `n` (key), `data`: bytes `n * chunk_size..` of blob `id` |
//! | `depot_engine_pending` | blob being written | `id` (key), `since` |
//!
//! Ids come from the sequence `depot_engine_ids`. The names carry `engine`
//! so that the engine and the PostgreSQL catalog can share one database.
//! `chunk_size` is kept per blob, so a restart with another `--chunk-size`
//! still reads the blobs written before it.
//!
//! Writing: a writer buffers at most one chunk. A blob that fits in one chunk
//! is a single statement that inserts its chunk and its `depot_engine_blobs`
//! row. A larger blob takes an id and a `depot_engine_pending` row at its
//! first full chunk, then streams chunks in, one statement each; the
//! transaction that finishes it removes the pending row and inserts the blob
//! row, so no reader ever sees a blob row without all its chunks. If the
//! digest is stored already (`INSERT ... ON CONFLICT`), the stored blob stays,
//! its `modified` is refreshed and the writer's chunks are deleted: two nodes
//! writing the same content both succeed and one blob remains.
//!
//! Abandoned writes: `abort`, or dropping a writer (through a spawned task),
//! deletes its chunks. What a crash leaves behind is deleted when any node
//! connects, and by the collector, but only for pending rows older than
//! [`STALE_AFTER`], because other nodes may be writing right now; a writer
//! refreshes its row's age while it streams. Chunks are deleted
//! [`DELETE_CHUNKS`] per transaction, each holding the pending row, which
//! goes with the last of them: a blob of gigabytes, in one statement, took
//! longer than an answer's wait. A deleted blob's chunks, and a second
//! copy's, become a pending write's and go the same way. A chunk insert
//! takes a key-share lock on the writer's pending row and inserts nothing
//! if the row is gone, so cleanup can never leave a chunk behind that a
//! late insert added. Failing at connect, cleanup only warns: a later one
//! finishes it.
//!
//! Reading a range fetches only the chunks that cover it, one query per
//! chunk with the next one fetched while the consumer takes the current one,
//! and cuts the first and last with `substring` in the server. Chunk data is
//! stored uncompressed (`STORAGE EXTERNAL`), so PostgreSQL reads only the
//! TOAST pages under that part of the chunk. A reader holds at most two
//! chunks beyond the one its consumer has, and no connection or transaction
//! between chunks, however slowly its client downloads.
//!
//! Why chunk rows of `bytea`, not large objects: measured with one client
//! writing then reading a 100 MB blob in 64 KiB pieces (PostgreSQL 15 on the
//! same two-core VM as depot, debug build, median of eight runs), `bytea` chunks
//! wrote 158 / 191 / 190 MB/s and read 528 / 692 / 624 MB/s at 256 KiB /
//! 1 MiB / 4 MiB, while large objects written and read in pieces of the same
//! sizes (`lo_put` / `lo_get`, which do work through a pool) managed 64 / 84
//! / 104 MB/s and 202 / 257 / 423 MB/s. Large objects also need bookkeeping:
//! every one must be unlinked, or it stays in `pg_largeobject`, a system
//! table shared by the whole database, for ever.
//! Chunk rows are plain rows: deleting them frees them, and `pg_dump`,
//! replication and permissions treat them like the rest of the data. (The
//! `fs` engine on the same blob: 966 MB/s written, read from the page cache.)
//!
//! Failures: operations that can be repeated safely (reads, `stat`, `list`,
//! `delete`, each chunk insert, and the finishing transaction) are retried
//! with [`pg::retry`] when the error is transient (refused or reset
//! connection, serialization failure, pool timeout); one that stays transient
//! is [`EngineError::Unavailable`], which clients see as 503.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use deadpool_postgres::Pool;
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result};
use crate::pg::{self, PgError};

const NAME: &str = "postgres";

/// Bytes per chunk row when not configured. Measured (module docs): 1 MiB
/// writes as fast as 4 MiB and reads as fast, with a quarter of the memory
/// per writer (one chunk) and reader (two); 256 KiB is slower at both.
pub const DEFAULT_CHUNK: usize = 1024 * 1024;
/// Chunk sizes accepted from the configuration.
const CHUNK_LIMITS: std::ops::RangeInclusive<usize> = 1024..=256 * 1024 * 1024;
/// Connections per engine (per depot node).
const POOL_SIZE: usize = 16;
/// Longest wait for a scan of a whole table (listing blobs, measuring).
const LISTING_WITHIN: Duration = Duration::from_secs(600);
/// Abandoned uploads one cleanup pass looks up at a time.
const REMOVAL_BATCH: i64 = 100;
/// Chunks one transaction of a removal deletes (64 MiB with the default
/// chunk). Each deleted row's TOAST is read and marked too: a blob of
/// gigabytes cold on disk, deleted in one statement, took longer than an
/// answer's wait, and was rolled back and started again from nothing.
const DELETE_CHUNKS: i64 = 64;
/// Age after which a pending write is taken for abandoned by a crash.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);
/// How often a writer refreshes the age of its pending row; far below
/// [`STALE_AFTER`].
const TOUCH_EVERY: Duration = Duration::from_secs(5 * 60);
/// Key of the advisory lock that serialises schema changes.
const SCHEMA_LOCK: i64 = 0x6465_706f_7465_6e67; // "depoteng"

const CREATE_TABLES: &str = "
    CREATE SEQUENCE IF NOT EXISTS depot_engine_ids;
    CREATE TABLE IF NOT EXISTS depot_engine_blobs (
        digest bytea PRIMARY KEY CHECK (octet_length(digest) = 32),
        id bigint NOT NULL,
        size bigint NOT NULL,
        chunk_size integer NOT NULL,
        modified timestamptz NOT NULL
    );
    CREATE TABLE IF NOT EXISTS depot_engine_pending (
        id bigint PRIMARY KEY,
        since timestamptz NOT NULL
    );
    CREATE TABLE IF NOT EXISTS depot_engine_chunks (
        id bigint NOT NULL,
        n integer NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (id, n)
    );";

/// The PostgreSQL engine; clones share one connection pool.
#[derive(Clone)]
pub struct PostgresEngine {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    chunk: usize,
    /// Age after which a pending write is taken for abandoned.
    stale_after: Duration,
}

impl std::fmt::Debug for PostgresEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresEngine(chunk {})", self.inner.chunk)
    }
}

fn pg_err(e: PgError) -> EngineError {
    match e {
        PgError::Unavailable(_) => EngineError::Unavailable(format!("{NAME} engine: {e}")),
        PgError::NoSpace(_) => EngineError::NoSpace,
        PgError::Query(m) => EngineError::other(NAME, m),
    }
}

/// A column of a row; a type mismatch is a bug, not something to retry.
fn col<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T, PgError> {
    row.try_get(i).map_err(|e| PgError::Query(format!("column {i}: {e}")))
}

fn reclaimed() -> EngineError {
    EngineError::other(
        NAME,
        "the upload's chunks were removed as abandoned (it stalled for longer than the cleanup age)",
    )
}

impl PostgresEngine {
    /// Connects to the database at `url`, creates the engine's tables when
    /// missing, and removes chunks that crashed writers left long ago.
    /// New blobs are stored in chunks of `chunk` bytes.
    pub async fn connect(url: &str, chunk: usize) -> Result<PostgresEngine> {
        PostgresEngine::connect_with(url, chunk, STALE_AFTER).await
    }

    /// [`connect`](PostgresEngine::connect), taking a pending write for
    /// abandoned once its row is `stale_after` old. `Duration::ZERO` takes
    /// every pending write for abandoned: only for a process that knows no
    /// other one writes to the database, such as `depot migrate`.
    pub async fn connect_with(url: &str, chunk: usize, stale_after: Duration) -> Result<PostgresEngine> {
        if !CHUNK_LIMITS.contains(&chunk) {
            return Err(EngineError::other(
                NAME,
                format!("chunk size {chunk} is outside {}..={} bytes", CHUNK_LIMITS.start(), CHUNK_LIMITS.end()),
            ));
        }
        let pool = pg::pool(url, POOL_SIZE).map_err(pg_err)?;
        pg::reach(&pool, url).await.map_err(pg_err)?;
        let engine = PostgresEngine { inner: Arc::new(Inner { pool, chunk, stale_after }) };
        engine.migrate().await?;
        // Leftover chunks only take space, and a later cleanup removes
        // them: a backlog too large for now must not keep nodes from
        // starting.
        if let Err(e) = engine.remove_abandoned().await {
            tracing::warn!("{NAME} engine: abandoned uploads left for a later cleanup: {e}");
        }
        Ok(engine)
    }

    async fn migrate(&self) -> Result<()> {
        let pool = &self.inner.pool;
        pg::retry(pool, "creating the engine's tables", || async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK]).await?;
            // Only DDL that is needed: even `IF NOT EXISTS` needs the right
            // to create tables, which a user of tables made for it may lack.
            let row = tx
                .query_one(
                    "SELECT to_regclass('depot_engine_chunks') IS NULL, \
                     to_regclass('depot_engine_blobs') IS NULL OR to_regclass('depot_engine_pending') IS NULL \
                     OR to_regclass('depot_engine_ids') IS NULL",
                    &[],
                )
                .await?;
            let (no_chunks, no_others): (bool, bool) = (col(&row, 0)?, col(&row, 1)?);
            if no_chunks || no_others {
                tx.batch_execute(CREATE_TABLES).await?;
            }
            if no_chunks {
                // Blob bytes rarely compress (media, archives), and
                // uncompressed TOAST lets `substring` read a part of a chunk
                // without the rest.
                tx.batch_execute("ALTER TABLE depot_engine_chunks ALTER COLUMN data SET STORAGE EXTERNAL").await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
        .map_err(pg_err)
    }
}

impl Inner {
    /// The row of a stored blob: (id, size, chunk size).
    async fn head(&self, digest: &Digest) -> Result<Option<(i64, u64, u64)>> {
        let pool = &self.pool;
        let key = &digest.0[..];
        pg::retry(pool, "looking up a blob", || async move {
            let client = pool.get().await?;
            let stmt =
                client.prepare_cached("SELECT id, size, chunk_size FROM depot_engine_blobs WHERE digest = $1").await?;
            match client.query_opt(&stmt, &[&key]).await? {
                Some(row) => {
                    let (id, size, chunk): (i64, i64, i32) = (col(&row, 0)?, col(&row, 1)?, col(&row, 2)?);
                    // A chunk size that is not positive reads as 0: damage.
                    Ok(Some((id, size as u64, u64::try_from(chunk).unwrap_or(0))))
                }
                None => Ok(None),
            }
        })
        .await
        .map_err(pg_err)
    }

    /// `len` bytes of chunk `n` of blob `id`, from byte `from` of the chunk;
    /// `whole` when that is all of the chunk.
    async fn fetch(&self, id: i64, n: i32, from: usize, len: usize, whole: bool) -> Result<Bytes> {
        let pool = &self.pool;
        // substring counts from 1; chunks are at most CHUNK_LIMITS.end().
        let (start, count) = (from as i32 + 1, len as i32);
        let row = pg::retry(pool, "reading a chunk", || async move {
            let client = pool.get().await?;
            let row = if whole {
                // substring of a whole multi-MiB value measured much slower.
                let stmt =
                    client.prepare_cached("SELECT data FROM depot_engine_chunks WHERE id = $1 AND n = $2").await?;
                client.query_opt(&stmt, &[&id, &n]).await?
            } else {
                let stmt = client
                    .prepare_cached(
                        "SELECT substring(data FROM $3 FOR $4) FROM depot_engine_chunks WHERE id = $1 AND n = $2",
                    )
                    .await?;
                client.query_opt(&stmt, &[&id, &n, &start, &count]).await?
            };
            row.map(|r| col::<Vec<u8>>(&r, 0)).transpose()
        })
        .await
        .map_err(pg_err)?;
        match row {
            Some(data) if data.len() == len => Ok(Bytes::from(data)),
            Some(_) => {
                Err(EngineError::damaged(NAME, format!("chunk {n} of blob {id} does not match its blob's size")))
            }
            None => Err(EngineError::damaged(NAME, format!("chunk {n} of blob {id} is missing"))),
        }
    }

    /// Removes what an unfinished writer staged under `id`.
    async fn discard(&self, id: i64) -> Result<()> {
        self.remove_pending(id, None).await.map(drop)
    }

    /// Deletes the chunks of the pending write `id`, [`DELETE_CHUNKS`] per
    /// transaction, and its pending row with the last of them; with
    /// `older_than` (seconds), only while the row is that old (a live
    /// writer refreshes it). Returns whether it removed them.
    async fn remove_pending(&self, id: i64, older_than: Option<f64>) -> Result<bool> {
        let pool = &self.pool;
        loop {
            let step = pg::retry(pool, "removing an abandoned upload", || async move {
                let mut client = pool.get().await?;
                let tx = client.transaction().await?;
                // The pending row held first: a chunk insert waits for this
                // transaction, as does a finish. No pending row: the chunks
                // are gone already, or belong to a blob whose finish
                // committed after all (its reply lost).
                let held = "SELECT 1 FROM depot_engine_pending WHERE id = $1 \
                            AND ($2::float8 IS NULL OR since <= now() - make_interval(secs => $2)) FOR UPDATE";
                if tx.query_opt(held, &[&id, &older_than]).await?.is_none() {
                    return Ok(None);
                }
                let deleted = tx
                    .execute(
                        "DELETE FROM depot_engine_chunks WHERE id = $1 AND n IN \
                         (SELECT n FROM depot_engine_chunks WHERE id = $1 ORDER BY n LIMIT $2)",
                        &[&id, &DELETE_CHUNKS],
                    )
                    .await?;
                let last = deleted < DELETE_CHUNKS as u64;
                if last {
                    tx.execute("DELETE FROM depot_engine_pending WHERE id = $1", &[&id]).await?;
                }
                tx.commit().await?;
                Ok(Some(last))
            })
            .await
            .map_err(pg_err)?;
            match step {
                None => return Ok(false),
                Some(true) => return Ok(true),
                Some(false) => {}
            }
        }
    }
}

struct PgWriter {
    inner: Arc<Inner>,
    buf: BytesMut,
    /// Bytes written so far.
    size: u64,
    /// Set from the first full chunk on, while a pending row names the blob;
    /// cleared once the blob is finished or discarded.
    id: Option<i64>,
    /// Chunks stored so far.
    stored: i32,
    touched: Instant,
}

impl PgWriter {
    /// Stores the next chunk, taking an id and a pending row first if needed.
    async fn store(&mut self, data: Bytes) -> Result<()> {
        let id = match self.id {
            Some(id) => id,
            None => {
                let id = self.begin().await?;
                self.id = Some(id);
                id
            }
        };
        if self.touched.elapsed() >= TOUCH_EVERY {
            self.touch(id).await?;
        }
        let pool = &self.inner.pool;
        let n = self.stored;
        let data = &data[..];
        let inserted = pg::retry(pool, "writing a chunk", || async move {
            let client = pool.get().await?;
            // Only while the pending row exists, and holding it against
            // cleanup until this insert commits. Upsert: a retry after a
            // lost reply must not fail on the chunk it already stored.
            let stmt = client
                .prepare_cached(
                    "INSERT INTO depot_engine_chunks (id, n, data) \
                     SELECT p.id, $2::integer, $3::bytea FROM depot_engine_pending p WHERE p.id = $1 FOR KEY SHARE \
                     ON CONFLICT (id, n) DO UPDATE SET data = EXCLUDED.data",
                )
                .await?;
            Ok(client.execute(&stmt, &[&id, &n, &data]).await?)
        })
        .await
        .map_err(pg_err)?;
        if inserted == 0 {
            return Err(reclaimed());
        }
        self.stored = n.checked_add(1).ok_or_else(|| EngineError::other(NAME, "blob has too many chunks"))?;
        Ok(())
    }

    /// A fresh id, marked pending from now on.
    async fn begin(&mut self) -> Result<i64> {
        let pool = &self.inner.pool;
        let id = pg::retry(pool, "starting an upload", || async move {
            let client = pool.get().await?;
            let stmt = client
                .prepare_cached(
                    "INSERT INTO depot_engine_pending (id, since) VALUES (nextval('depot_engine_ids'), now()) RETURNING id",
                )
                .await?;
            col::<i64>(&client.query_one(&stmt, &[]).await?, 0)
        })
        .await
        .map_err(pg_err)?;
        self.touched = Instant::now();
        Ok(id)
    }

    /// Keeps a long upload from looking abandoned.
    async fn touch(&mut self, id: i64) -> Result<()> {
        let pool = &self.inner.pool;
        let n = pg::retry(pool, "refreshing an upload", || async move {
            let client = pool.get().await?;
            Ok(client.execute("UPDATE depot_engine_pending SET since = now() WHERE id = $1", &[&id]).await?)
        })
        .await
        .map_err(pg_err)?;
        if n == 0 {
            return Err(reclaimed());
        }
        self.touched = Instant::now();
        Ok(())
    }

    /// Stores a blob of at most one chunk in one statement: its chunk (when
    /// not empty) and its row, or, if the digest is stored already, only a
    /// fresher `modified`.
    async fn finish_small(&self, digest: &Digest, data: Bytes) -> Result<u64> {
        let pool = &self.inner.pool;
        let (key, size, chunk) = (&digest.0[..], data.len() as i64, self.inner.chunk as i32);
        let (data, has_data) = (&data[..], !data.is_empty());
        // Repeating it after a lost reply is harmless: the digest is then
        // stored and only `modified` changes.
        let size = pg::retry(pool, "storing a blob", || async move {
            let client = pool.get().await?;
            let stmt = client
                .prepare_cached(
                    "WITH fresh AS (SELECT nextval('depot_engine_ids') AS id), \
                     blob AS ( \
                         INSERT INTO depot_engine_blobs (digest, id, size, chunk_size, modified) \
                         SELECT $1::bytea, fresh.id, $2::bigint, $3::integer, now() FROM fresh \
                         ON CONFLICT (digest) DO UPDATE SET modified = now() \
                         RETURNING id, size), \
                     chunk AS ( \
                         INSERT INTO depot_engine_chunks (id, n, data) \
                         SELECT blob.id, 0, $4::bytea FROM blob JOIN fresh ON blob.id = fresh.id WHERE $5::boolean) \
                     SELECT size FROM blob",
                )
                .await?;
            col::<i64>(&client.query_one(&stmt, &[&key, &size, &chunk, &data, &has_data]).await?, 0)
        })
        .await
        .map_err(pg_err)?;
        Ok(size as u64)
    }

    /// Turns the stored chunks of blob `id` into the blob `digest`, in one
    /// transaction, or drops them for the blob of that digest already stored.
    async fn finish_chunked(&self, digest: &Digest, id: i64) -> Result<u64> {
        let pool = &self.inner.pool;
        let (key, size, chunk, stored) = (&digest.0[..], self.size as i64, self.inner.chunk as i32, self.stored as i64);
        let finished = pg::retry(pool, "finishing a blob", || async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            if tx.execute("DELETE FROM depot_engine_pending WHERE id = $1", &[&id]).await? == 0 {
                // Gone: an earlier attempt committed before its reply was
                // lost (and the digest is stored), or cleanup took the chunks
                // (and it is stored only if someone else wrote it).
                let sql = "UPDATE depot_engine_blobs SET modified = now() WHERE digest = $1 RETURNING size";
                let size = tx.query_opt(sql, &[&key]).await?.map(|r| col::<i64>(&r, 0)).transpose()?;
                tx.commit().await?;
                return Ok(size.map_or(Finished::Reclaimed, Finished::Stored));
            }
            // Never a blob row without all its chunks, whatever removed one.
            let sql = "SELECT count(*) FROM depot_engine_chunks WHERE id = $1";
            let found = col::<i64>(&tx.query_one(sql, &[&id]).await?, 0)?;
            if found != stored {
                return Ok(Finished::ChunksLost(found));
            }
            let row = tx
                .query_one(
                    "INSERT INTO depot_engine_blobs (digest, id, size, chunk_size, modified) \
                     VALUES ($1, $2, $3, $4, now()) \
                     ON CONFLICT (digest) DO UPDATE SET modified = now() \
                     RETURNING id, size",
                    &[&key, &id, &size, &chunk],
                )
                .await?;
            let (kept, size): (i64, i64) = (col(&row, 0)?, col(&row, 1)?);
            if kept != id {
                // Stored before: these chunks are removed as a discard's.
                tx.execute("INSERT INTO depot_engine_pending (id, since) VALUES ($1, now())", &[&id]).await?;
                tx.commit().await?;
                return Ok(Finished::StoredBefore(size));
            }
            tx.commit().await?;
            Ok(Finished::Stored(size))
        })
        .await
        .map_err(pg_err)?;
        match finished {
            Finished::Stored(size) => Ok(size as u64),
            Finished::StoredBefore(size) => {
                super::discard_staged(self.inner.discard(id)).await;
                Ok(size as u64)
            }
            Finished::Reclaimed => Err(reclaimed()),
            Finished::ChunksLost(found) => Err(EngineError::other(
                NAME,
                format!("only {found} of the upload's {stored} chunks are stored; the blob was not kept"),
            )),
        }
    }
}

/// How the transaction that finishes a chunked blob ended.
enum Finished {
    /// The blob is stored, with this size.
    Stored(i64),
    /// The blob was stored already, with this size: the upload's chunks are
    /// pending again, to be removed.
    StoredBefore(i64),
    /// The pending row was gone, and no blob of the digest is stored.
    Reclaimed,
    /// Fewer chunks than were written are stored; nothing was committed.
    ChunksLost(i64),
}

#[async_trait]
impl BlobWriter for PgWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.size += chunk.len() as u64;
        self.buf.extend_from_slice(&chunk);
        while self.buf.len() >= self.inner.chunk {
            let full = self.buf.split_to(self.inner.chunk).freeze();
            self.store(full).await?;
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        let last = self.buf.split().freeze();
        let size = match self.id {
            None => self.finish_small(&digest, last).await?,
            Some(id) => {
                if !last.is_empty() {
                    self.store(last).await?;
                }
                let size = self.finish_chunked(&digest, id).await?;
                self.id = None;
                size
            }
        };
        Ok(BlobRef { digest, size, locator: Vec::new() })
    }

    async fn abort(mut self: Box<Self>) {
        if let Some(id) = self.id.take() {
            super::discard_staged(self.inner.discard(id)).await;
        }
    }
}

impl Drop for PgWriter {
    fn drop(&mut self) {
        // A writer dropped mid-stream (client gone) removes its chunks in the
        // background; without a runtime, the pending row remains for a later
        // start-up to find.
        if let Some(id) = self.id.take() {
            let inner = self.inner.clone();
            super::discard_staged_later(async move { inner.discard(id).await });
        }
    }
}

#[async_trait]
impl BlobEngine for PostgresEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Deletes the chunks of writes pending for longer than the engine's
    /// cleanup age ([`STALE_AFTER`] unless connected otherwise): their
    /// writer crashed, or lost its connection for good.
    async fn remove_abandoned(&self) -> Result<()> {
        let pool = &self.inner.pool;
        let age = self.inner.stale_after.as_secs_f64();
        let mut removed = 0;
        // A few chunks per transaction, however many uploads a crash loop
        // left and however large: what is removed stays removed.
        let outcome = 'passes: loop {
            let ids = pg::retry(pool, "finding abandoned uploads", || async move {
                let client = pool.get().await?;
                let rows = client
                    .query(
                        "SELECT id FROM depot_engine_pending WHERE since <= now() - make_interval(secs => $1) \
                         ORDER BY id LIMIT $2",
                        &[&age, &REMOVAL_BATCH],
                    )
                    .await?;
                rows.iter().map(|r| col::<i64>(r, 0)).collect::<Result<Vec<_>, _>>()
            })
            .await;
            let ids = match ids {
                Ok(ids) => ids,
                Err(e) => break Err(pg_err(e)),
            };
            for id in &ids {
                // The age again: a writer may have refreshed its row since.
                match self.inner.remove_pending(*id, Some(age)).await {
                    Ok(gone) => removed += usize::from(gone),
                    Err(e) => break 'passes Err(e),
                }
            }
            if ids.len() < REMOVAL_BATCH as usize {
                break Ok(());
            }
        };
        if removed > 0 {
            tracing::info!("{NAME} engine: removed the chunks of {removed} abandoned uploads");
        }
        outcome
    }

    async fn writer(&self, _size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        Ok(Box::new(PgWriter {
            inner: self.inner.clone(),
            buf: BytesMut::new(),
            size: 0,
            id: None,
            stored: 0,
            touched: Instant::now(),
        }))
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        let (id, size, chunk) = self.inner.head(&blob.digest).await?.ok_or(EngineError::NotFound(blob.digest))?;
        if range.end > size || range.start > range.end {
            return Err(EngineError::beyond_end(NAME, blob, size));
        }
        if range.is_empty() {
            return Ok(Box::pin(futures::stream::empty()));
        }
        if chunk == 0 {
            return Err(EngineError::damaged(NAME, "the blob's chunk size is not positive"));
        }
        let first = range.start / chunk;
        let last = (range.end - 1) / chunk;
        // The part of chunk `n` inside the range: (n, from, len, whole chunk).
        let part = move |n: u64| {
            let at = n * chunk;
            let from = range.start.max(at) - at;
            let to = range.end.min(at + chunk) - at;
            (n as i32, from as usize, (to - from) as usize, from == 0 && to == chunk.min(size - at))
        };
        if first == last {
            let (n, from, len, whole) = part(first);
            let bytes = self.inner.fetch(id, n, from, len, whole).await?;
            return Ok(Box::pin(futures::stream::once(async { Ok(bytes) })));
        }
        // One chunk in the channel, the next one being fetched.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes>>(1);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            for n in first..=last {
                let (n, from, len, whole) = part(n);
                let item = inner.fetch(id, n, from, len, whole).await;
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Box::pin(super::channel_stream(rx)))
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        let pool = &self.inner.pool;
        let key = &blob.digest.0[..];
        // The blob's row goes, and its chunks become a pending write's,
        // removed a few at a time (or by a later cleanup, if this stops).
        let id = pg::retry(pool, "deleting a blob", || async move {
            let client = pool.get().await?;
            let stmt = client
                .prepare_cached(
                    "WITH blob AS (DELETE FROM depot_engine_blobs WHERE digest = $1 RETURNING id) \
                     INSERT INTO depot_engine_pending (id, since) SELECT id, now() FROM blob RETURNING id",
                )
                .await?;
            client.query_opt(&stmt, &[&key]).await?.map(|r| col::<i64>(&r, 0)).transpose()
        })
        .await
        .map_err(pg_err)?;
        match id {
            Some(id) => self.inner.remove_pending(id, None).await.map(drop),
            None => Ok(()),
        }
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        Ok(self.inner.head(&blob.digest).await?.map(|(_, size, _)| size))
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        let pool = &self.inner.pool;
        let rows = pg::retry_within(pool, "listing blobs", LISTING_WITHIN, || async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            pg::allow(&tx, LISTING_WITHIN).await?;
            Ok(tx.query("SELECT digest, size, modified FROM depot_engine_blobs", &[]).await?)
        })
        .await
        .map_err(pg_err)?;
        rows.iter()
            .map(|row| {
                let (digest, size, modified): (&[u8], i64, SystemTime) =
                    (col(row, 0).map_err(pg_err)?, col(row, 1).map_err(pg_err)?, col(row, 2).map_err(pg_err)?);
                let digest =
                    digest.try_into().map_err(|_| EngineError::other(NAME, "a stored digest is not 32 bytes"))?;
                Ok(BlobInfo { digest: Digest(digest), size: size as u64, locator: Vec::new(), modified })
            })
            .collect()
    }

    async fn disk_usage(&self) -> Result<Option<u64>> {
        let pool = &self.inner.pool;
        // No scan: the sizes PostgreSQL keeps, answered at once. On the
        // request path (`/_/stats`), so within the usual time.
        let bytes = pg::retry(pool, "measuring the tables", || async move {
            let client = pool.get().await?;
            let row = client
                .query_one(
                    "SELECT pg_total_relation_size('depot_engine_blobs') \
                     + pg_total_relation_size('depot_engine_chunks') \
                     + pg_total_relation_size('depot_engine_pending')",
                    &[],
                )
                .await?;
            col::<i64>(&row, 0)
        })
        .await
        .map_err(pg_err)?;
        Ok(Some(bytes as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::BlobEngineExt;
    use crate::engine::conformance;

    async fn engine(chunk: usize) -> (PostgresEngine, String) {
        let url = pg::fresh_test_database().await;
        (PostgresEngine::connect(&url, chunk).await.unwrap(), url)
    }

    async fn count(engine: &PostgresEngine, sql: &str) -> i64 {
        engine.inner.pool.get().await.unwrap().query_one(sql, &[]).await.unwrap().get(0)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let (engine, _) = engine(DEFAULT_CHUNK).await;
        conformance::run_all(&engine).await;
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_pending").await, 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance_with_small_chunks() {
        let (engine, _) = engine(100_000).await;
        conformance::run_all(&engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn nodes_starting_together_create_the_tables_once() {
        let url = pg::fresh_test_database().await;
        let nodes = futures::future::join_all((0..4).map(|_| PostgresEngine::connect(&url, DEFAULT_CHUNK))).await;
        for node in nodes {
            assert!(node.unwrap().list().await.unwrap().is_empty());
        }
        let engine = PostgresEngine::connect(&url, DEFAULT_CHUNK).await.unwrap();
        let storage = "SELECT count(*) FROM pg_attribute WHERE attrelid = 'depot_engine_chunks'::regclass \
                       AND attname = 'data' AND attstorage = 'e'";
        assert_eq!(count(&engine, storage).await, 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn two_nodes_writing_the_same_content_leave_one_blob() {
        let (a, url) = engine(64 * 1024).await;
        let b = PostgresEngine::connect(&url, 64 * 1024).await.unwrap();
        let data = conformance::pattern(1_000_000, 42);
        for _ in 0..3 {
            let (x, y) = futures::join!(a.put_bytes(data.clone()), b.put_bytes(data.clone()));
            assert_eq!(x.unwrap(), y.unwrap());
        }
        for engine in [&a, &b] {
            let listed = engine.list().await.unwrap();
            assert_eq!(listed.len(), 1);
            assert_eq!(listed[0].size, 1_000_000);
        }
        // Only the kept blob's chunks remain: 1,000,000 bytes in 64 KiB chunks.
        assert_eq!(count(&a, "SELECT count(*) FROM depot_engine_chunks").await, 16);
        assert_eq!(count(&a, "SELECT count(*) FROM depot_engine_pending").await, 0);
        let blob = BlobRef { digest: listed_digest(&b).await, size: 1_000_000, locator: Vec::new() };
        assert!(a.read_to_vec(&blob, ByteRange::full(1_000_000)).await.unwrap() == data);
    }

    async fn listed_digest(engine: &PostgresEngine) -> Digest {
        engine.list().await.unwrap()[0].digest
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn stale_pending_chunks_are_removed_at_connect_and_live_ones_kept() {
        let (engine, url) = engine(64 * 1024).await;
        let client = engine.inner.pool.get().await.unwrap();
        // A writer that crashed two hours ago, and one on another node that
        // is writing right now.
        client
            .batch_execute(
                "INSERT INTO depot_engine_pending VALUES (1001, now() - interval '2 hours'), (1002, now());
                 INSERT INTO depot_engine_chunks SELECT id, n, '\\x00ff' FROM (VALUES (1001), (1002)) AS i (id),
                     generate_series(0, 2) AS n;",
            )
            .await
            .unwrap();
        drop(client);
        PostgresEngine::connect(&url, 64 * 1024).await.unwrap();
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_chunks WHERE id = 1001").await, 0);
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_chunks WHERE id = 1002").await, 3);
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_pending").await, 1);
    }

    /// Cleanup at connect removes a backlog in batches: a batch that fails
    /// keeps what earlier ones removed, and the node still starts.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_failing_cleanup_keeps_earlier_batches_and_lets_the_node_start() {
        let (engine, url) = engine(64 * 1024).await;
        let last = REMOVAL_BATCH + 1;
        let client = engine.inner.pool.get().await.unwrap();
        // Crashed writers, one more than a batch; removing the last fails.
        client
            .batch_execute(&format!(
                "INSERT INTO depot_engine_pending SELECT id, now() - interval '2 hours' FROM generate_series(1, {last}) AS id;
                 INSERT INTO depot_engine_chunks SELECT id, 0, '\\x00ff' FROM generate_series(1, {last}) AS id;
                 CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
                     $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
                 CREATE TRIGGER refuse BEFORE DELETE ON depot_engine_pending
                     FOR EACH ROW WHEN (OLD.id = {last}) EXECUTE FUNCTION refuse();"
            ))
            .await
            .unwrap();
        drop(client);
        PostgresEngine::connect(&url, 64 * 1024).await.unwrap();
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_pending").await, 1);
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_chunks").await, 1);
    }

    /// Chunks go a few per transaction, to the last: those of a deleted
    /// blob, and those of a second copy of content stored already.
    #[tokio::test(flavor = "multi_thread")]
    async fn blobs_of_many_chunks_are_removed_to_the_last() {
        let (engine, _) = engine(1024).await;
        let data = conformance::pattern(200 * 1024 + 5, 4);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        let chunks = "SELECT count(*) FROM depot_engine_chunks";
        assert_eq!(count(&engine, chunks).await, 201);
        engine.put_bytes(data.clone()).await.unwrap();
        assert_eq!(count(&engine, chunks).await, 201, "the second copy's chunks stay, or the first's go");
        assert!(engine.read_to_vec(&blob, ByteRange::full(data.len() as u64)).await.unwrap() == data);
        engine.delete(&blob).await.unwrap();
        assert_eq!(count(&engine, chunks).await, 0);
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_pending").await, 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn abandoned_writers_remove_their_chunks() {
        let (engine, _) = engine(64 * 1024).await;
        let chunks = "SELECT count(*) FROM depot_engine_chunks";
        let mut aborted = engine.writer(None).await.unwrap();
        aborted.write(conformance::pattern(300_000, 1)).await.unwrap();
        assert_eq!(count(&engine, chunks).await, 4);
        aborted.abort().await;
        assert_eq!(count(&engine, chunks).await, 0);
        let mut dropped = engine.writer(None).await.unwrap();
        dropped.write(conformance::pattern(300_000, 2)).await.unwrap();
        drop(dropped);
        let deadline = Instant::now() + Duration::from_secs(10);
        while count(&engine, chunks).await > 0 {
            assert!(Instant::now() < deadline, "a dropped writer's chunks remain");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_pending").await, 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_writer_whose_chunks_were_reclaimed_fails() {
        let (engine, _) = engine(64 * 1024).await;
        let data = conformance::pattern(200_000, 3);
        let mut writer = engine.writer(None).await.unwrap();
        writer.write(data.slice(..100_000)).await.unwrap();
        // What cleanup does to an upload that looked abandoned.
        engine.inner.discard(writer_id(&engine).await).await.unwrap();
        let failed = match writer.write(data.slice(100_000..)).await {
            Err(e) => Err(e),
            Ok(()) => writer.finish(Digest(crate::engine::sha2_digest(&data))).await.map(|_| ()),
        };
        assert!(failed.unwrap_err().to_string().contains("abandoned"));
        assert!(engine.list().await.unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_blob_missing_a_chunk_is_not_kept() {
        let (engine, _) = engine(64 * 1024).await;
        let data = conformance::pattern(200_000, 4);
        let mut writer = engine.writer(None).await.unwrap();
        writer.write(data.clone()).await.unwrap();
        let client = engine.inner.pool.get().await.unwrap();
        client.execute("DELETE FROM depot_engine_chunks WHERE n = 1", &[]).await.unwrap();
        drop(client);
        let err = writer.finish(Digest(crate::engine::sha2_digest(&data))).await.unwrap_err();
        assert!(err.to_string().contains("only 3 of the upload's 4 chunks"), "{err}");
        assert!(engine.list().await.unwrap().is_empty());
    }

    /// A chunk size that is not positive is damage, not a division by zero.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_blob_whose_chunk_size_is_not_positive_is_damage() {
        let (engine, _) = engine(64 * 1024).await;
        let blob = engine.put_bytes(conformance::pattern(1000, 6)).await.unwrap();
        let client = engine.inner.pool.get().await.unwrap();
        for size in [0, -5] {
            client.execute("UPDATE depot_engine_blobs SET chunk_size = $1", &[&size]).await.unwrap();
            let read = engine.read_to_vec(&blob, ByteRange::full(1000)).await;
            assert!(matches!(read, Err(EngineError::Damaged { .. })), "chunk size {size}");
        }
    }

    /// A blob shorter than its record says is damage, which `verify` names
    /// (any other error ends it); a range past the record's end is not.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_blob_shorter_than_its_record_is_damage() {
        let (engine, _) = engine(64 * 1024).await;
        let blob = engine.put_bytes(conformance::pattern(1000, 7)).await.unwrap();
        let client = engine.inner.pool.get().await.unwrap();
        client.execute("UPDATE depot_engine_blobs SET size = 600", &[]).await.unwrap();
        let read = engine.read_to_vec(&blob, ByteRange::full(1000)).await;
        assert!(matches!(read, Err(EngineError::Damaged { .. })), "{read:?}");
        let long = BlobRef { size: 600, ..blob };
        let read = engine.read_to_vec(&long, ByteRange { start: 0, end: 700 }).await;
        assert!(matches!(read, Err(EngineError::Other { .. })), "{read:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn discarding_an_upload_whose_finish_committed_keeps_the_blob() {
        // A writer dropped while its finishing commit was in flight.
        let (engine, _) = engine(64 * 1024).await;
        let data = conformance::pattern(200_000, 5);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        let id = count(&engine, "SELECT id FROM depot_engine_blobs").await;
        engine.inner.discard(id).await.unwrap();
        assert!(engine.read_to_vec(&blob, ByteRange::full(200_000)).await.unwrap() == data);
    }

    /// A request the server holds without answering (here: behind a lock
    /// taken elsewhere; a hung host looks the same) fails as unavailable
    /// after [`pg::ANSWER_WITHIN`] rather than waiting forever, and the
    /// engine answers again once the server does.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_operation_the_server_never_answers_fails_as_unavailable() {
        let (engine, url) = engine(64 * 1024).await;
        let blob = engine.put_bytes(conformance::pattern(1000, 7)).await.unwrap();
        let (locker, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        locker.batch_execute("BEGIN; LOCK TABLE depot_engine_blobs IN ACCESS EXCLUSIVE MODE").await.unwrap();
        let started = Instant::now();
        let e = engine.stat(&blob).await.unwrap_err();
        let waited = started.elapsed();
        assert!(matches!(e, EngineError::Unavailable(_)) && e.to_string().contains("no answer"), "{e}");
        assert!(waited >= pg::ANSWER_WITHIN && waited < pg::ANSWER_WITHIN + Duration::from_secs(5), "{waited:?}");
        locker.batch_execute("COMMIT").await.unwrap();
        assert_eq!(engine.stat(&blob).await.unwrap(), Some(1000));
    }

    /// A write whose cleanup never reached the server (it was down) is
    /// not left for the next start: the collector's next pass removes its
    /// chunks once they are older than the cleanup age.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_collector_removes_the_chunks_of_writes_abandoned_long_ago() {
        use crate::catalog::rocks::RocksCatalog;
        use crate::store::{Store, StoreConfig};
        let (engine, _) = engine(64 * 1024).await;
        let mut lost = engine.writer(None).await.unwrap();
        lost.write(conformance::pattern(300_000, 5)).await.unwrap();
        let id = writer_id(&engine).await;
        // Its writer lost the server for good: it never cleans up.
        std::mem::forget(lost);
        let client = engine.inner.pool.get().await.unwrap();
        let backdate = "UPDATE depot_engine_pending SET since = now() - interval '2 hours' WHERE id = $1";
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        let store = Store::open(catalog, Arc::new(engine.clone()), StoreConfig::default()).await.unwrap();
        store.gc().await.unwrap();
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_chunks").await, 4, "a young write is kept");
        client.execute(backdate, &[&id]).await.unwrap();
        store.gc().await.unwrap();
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_chunks").await, 0);
        assert_eq!(count(&engine, "SELECT count(*) FROM depot_engine_pending").await, 0);
    }

    async fn writer_id(engine: &PostgresEngine) -> i64 {
        count(engine, "SELECT id FROM depot_engine_pending").await
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn range_reads_fetch_only_the_chunks_they_need() {
        let (engine, _) = engine(10_000).await;
        let data = conformance::pattern(100_000, 7);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        // Remove the chunks outside 30,000..55,000 (chunks 3 to 5).
        let client = engine.inner.pool.get().await.unwrap();
        client.execute("DELETE FROM depot_engine_chunks WHERE n NOT BETWEEN 3 AND 5", &[]).await.unwrap();
        drop(client);
        for (start, end) in [(30_000, 55_000), (31_234, 31_235), (39_999, 50_001), (30_000, 60_000)] {
            let got = engine.read_to_vec(&blob, ByteRange { start, end }).await.unwrap();
            assert!(got == data[start as usize..end as usize], "range {start}..{end}");
        }
        let err = engine.read_to_vec(&blob, ByteRange { start: 29_999, end: 30_001 }).await.unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn blobs_keep_the_chunk_size_they_were_written_with() {
        let (small, url) = engine(10_000).await;
        let data = conformance::pattern(95_000, 8);
        let blob = small.put_bytes(data.clone()).await.unwrap();
        let large = PostgresEngine::connect(&url, 64 * 1024).await.unwrap();
        for (start, end) in [(0, 95_000), (9_999, 70_001), (94_000, 95_000)] {
            let got = large.read_to_vec(&blob, ByteRange { start, end }).await.unwrap();
            assert!(got == data[start as usize..end as usize], "range {start}..{end}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_unreachable_server_is_unavailable_within_seconds() {
        let started = Instant::now();
        let url = "postgres://depot:depot@127.0.0.1:1/depot";
        let err = match PostgresEngine::connect(url, DEFAULT_CHUNK).await {
            Err(e) => e,
            Ok(engine) => {
                engine.stat(&BlobRef { digest: Digest([0; 32]), size: 0, locator: Vec::new() }).await.unwrap_err()
            }
        };
        assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("postgres engine") && message.contains("unavailable"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn disk_usage_grows_with_the_blobs() {
        let (engine, _) = engine(DEFAULT_CHUNK).await;
        let before = engine.disk_usage().await.unwrap().unwrap();
        engine.put_bytes(conformance::pattern(3_000_000, 9)).await.unwrap();
        let after = engine.disk_usage().await.unwrap().unwrap();
        assert!(after >= before + 3_000_000, "{before} -> {after}");
    }
}
