//! The shared catalog, in PostgreSQL: several depot nodes over one database
//! form one store.
//!
//! Tables (created at start-up, under an advisory lock so nodes starting
//! together do not race):
//!
//! | table | row |
//! |---|---|
//! | `depot_catalog_buckets` | name, created, public_read |
//! | `depot_catalog_objects` | bucket, key (`COLLATE "C"`: byte order, as S3 lists), the record as postcard bytes |
//! | `depot_catalog_blobs` | digest, size, locator, refs, unreferenced_since (indexed where refs = 0) |
//! | `depot_catalog_stats` | 16 shards of running totals: a transaction adds its deltas to one random shard, so writers rarely wait on each other |
//! | `depot_catalog_claims` | id, digest, since: a writer on some node is about to store bytes of the digest and reference them |
//! | `depot_catalog_deleting` | digest, since: a node is deleting bytes of the digest |
//! | `depot_catalog_nodes` | name, seen: a node serving the catalog, heard from at `seen` |
//!
//! A write is one transaction at READ COMMITTED. It first takes
//! transaction-scoped advisory locks on the hashes of the keys it writes (in
//! sorted order), so two writers of one key queue up even when the key does
//! not exist yet, and the record it replaces is the one it read. Blob
//! reference rows are changed in digest order, so concurrent writers cannot
//! deadlock on them; a bucket row is read `FOR SHARE` by writers and locked
//! `FOR UPDATE` by a bucket delete. A transaction that meets a lost
//! connection, a serialization failure or a deadlock is retried from the
//! start with bounded backoff ([`crate::pg::retry`]); replaying a put is
//! harmless, because putting the same record again nets out to no change in
//! reference counts. A replay after a COMMIT whose answer was lost that finds
//! its condition failed, or its key gone, may be finding its own first
//! attempt's work: it answers that the outcome is unknown ([`unsure`]).
//!
//! Writers and collectors on different nodes keep apart through the claims
//! and the deletes in progress, each changed under a transaction-scoped
//! advisory lock on the digest: a writer claims a digest before its bytes
//! land, waiting while a delete of that digest is in progress; a collector
//! deletes bytes only when no writer claims them, and marks the delete in
//! progress first. So a collector's delete never reaches bytes a writer
//! has just stored, though the engines address bytes by SHA-256 alone. A
//! claim or a delete older than its node could still hold it (a node that
//! crashed) no longer counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Pool, Transaction};

use super::{
    BlobRecord, BucketRecord, Catalog, CatalogError, CatalogStats, ClaimId, ListPage, ListQuery, ObjectPut,
    ObjectRecord, Precondition, PutOutcome, Result, past,
};
use crate::engine::{BlobRef, Digest, Locator};
use crate::pg::{self, PgError};

/// Runs the block in a transaction (`$txn` names it), committing on
/// success; the whole of it is retried on transient failures.
macro_rules! in_txn {
    ($pool:expr, $what:expr, |$txn:ident $(, $replay:ident)?| $body:block) => {
        in_txn!($pool, $what, within pg::ANSWER_WITHIN, |$txn $(, $replay)?| $body)
    };
    ($pool:expr, $what:expr, within $limit:expr, |$txn:ident $(, $replay:ident)?| $body:block) => {{
        // A COMMIT whose answer was lost may have been applied: the body
        // may ask (`$replay`) whether it runs again after one.
        let unsure = std::sync::atomic::AtomicBool::new(false);
        let outcome = pg::retry_within(&$pool, $what, $limit, || async {
            $(let $replay = unsure.load(std::sync::atomic::Ordering::Relaxed);)?
            let mut client = $pool.get().await?;
            let transaction = client.transaction().await?;
            if $limit > pg::ANSWER_WITHIN {
                pg::allow(&transaction, $limit).await?;
            }
            let result = {
                let $txn = &transaction;
                async { $body }.await
            };
            match result {
                Ok(v) => {
                    if let Err(e) = transaction.commit().await {
                        unsure.store(true, std::sync::atomic::Ordering::Relaxed);
                        return Err(e.into());
                    }
                    Ok(Ok(v))
                }
                Err(TxnError::Pg(e)) => Err(e),
                Err(TxnError::Catalog(e)) => Ok(Err(e)),
            }
        })
        .await?;
        outcome
    }};
}

/// What a write answers when it runs again after a COMMIT whose answer was
/// lost, and finds what that COMMIT would have left: a precondition that
/// no longer holds, a key already gone. Replaying a write is harmless, but
/// the replay cannot tell whether it was the first attempt that changed
/// the record, and a 412 or 404 for a write that was applied would be a
/// wrong answer, where this one (503) says the outcome is unknown.
fn unsure() -> CatalogError {
    CatalogError::Unavailable(
        "the catalog's server did not confirm the write, which may have been applied: read the object before \
         writing it again"
            .into(),
    )
}

const STATS_SHARDS: i32 = 16;
/// Connections per node for requests and maintenance.
const POOL_SIZE: usize = 16;
/// Connections per node for its heartbeats, apart from [`POOL_SIZE`]: with
/// every request connection held up (a lock another node holds, a slow
/// disk on the server), a heartbeat waiting its turn behind them would let
/// the node's lease on writes lapse, and unrelated writes fail.
const NODE_POOL_SIZE: usize = 2;
/// Longest a schema change waits for each lock it needs. DDL locks its
/// table against every reader and writer, and while it waits behind a
/// transaction under way, every request behind it waits too.
const DDL_LOCK_WITHIN: Duration = Duration::from_secs(2);
/// Longest wait for a transaction over whole tables (schema changes,
/// maintenance), where others answer within [`pg::ANSWER_WITHIN`].
const SCAN_WITHIN: Duration = Duration::from_secs(600);

const MIGRATION: &str = r#"
CREATE TABLE IF NOT EXISTS depot_catalog_buckets (
    name text PRIMARY KEY,
    created bigint NOT NULL,
    public_read boolean NOT NULL DEFAULT false
);
ALTER TABLE depot_catalog_buckets ADD COLUMN IF NOT EXISTS owner text NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS depot_catalog_objects (
    bucket text NOT NULL,
    key text COLLATE "C" NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (bucket, key)
);
CREATE TABLE IF NOT EXISTS depot_catalog_blobs (
    digest bytea PRIMARY KEY,
    size bigint NOT NULL,
    locator bytea NOT NULL,
    refs bigint NOT NULL,
    unreferenced_since bigint
);
CREATE INDEX IF NOT EXISTS depot_catalog_blobs_dead ON depot_catalog_blobs (unreferenced_since) WHERE refs = 0;
CREATE TABLE IF NOT EXISTS depot_catalog_stats (
    shard int PRIMARY KEY,
    objects bigint NOT NULL DEFAULT 0,
    logical_bytes bigint NOT NULL DEFAULT 0,
    blobs bigint NOT NULL DEFAULT 0,
    blob_bytes bigint NOT NULL DEFAULT 0
);
INSERT INTO depot_catalog_stats (shard) SELECT generate_series(0, 15) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS depot_catalog_claims (
    id bigserial PRIMARY KEY,
    digest bytea NOT NULL,
    since timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS depot_catalog_claims_digest ON depot_catalog_claims (digest);
CREATE TABLE IF NOT EXISTS depot_catalog_deleting (
    digest bytea PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE depot_catalog_deleting ADD COLUMN IF NOT EXISTS token bigint NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS depot_catalog_nodes (
    name text PRIMARY KEY,
    seen timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS depot_catalog_settings (
    name text PRIMARY KEY,
    value text NOT NULL
);
"#;

/// Any advisory-lock key: the migration's, apart from the per-key locks.
const MIGRATION_LOCK: i64 = 0x6465_706f_7400_0001;

/// The first of the two keys of a digest's advisory lock: the two-key
/// locks are apart from the one-key migration lock.
const DIGEST_LOCKS: i32 = 0x6465_706f;

/// The first of the two keys of an object key's advisory lock.
const KEY_LOCKS: i32 = 0x6465_706e;

/// Object keys, and digests, are locked by stripe, this many of each. A
/// lock per key ran PostgreSQL out of its shared lock table (64 locks per
/// connection by default, some 6,400 for the whole server) at a batch of
/// a few thousand entries: "out of shared memory". Two keys of one stripe
/// wait for each other, as in the embedded catalog.
const STRIPES: u64 = 512;

/// The longest key this catalog takes, in bytes: a B-tree index entry of
/// PostgreSQL holds some 2,700 bytes at most, and an object's (bucket, key)
/// is one, with its bucket name of up to 63 bytes beside the key.
pub const MAX_KEY_BYTES: usize = 2500;

/// How long a claim counts: from the end of an upload's body to its commit,
/// seconds at most, unless its node crashed meanwhile; a batch that takes
/// longer renews its claims.
const CLAIM_LIFE: &str = "10 minutes";

/// How long a delete in progress counts, as SQL: [`super::DELETE_MARK_LIFE`].
fn delete_life() -> String {
    format!("interval '{} seconds'", super::DELETE_MARK_LIFE.as_secs())
}

/// How often a writer looks again at a delete in progress it waits for.
const DELETE_POLL: Duration = Duration::from_millis(20);

/// The PostgreSQL catalog.
#[derive(Clone)]
pub struct PostgresCatalog {
    pool: Pool,
    /// For the notes of live nodes alone ([`NODE_POOL_SIZE`]).
    nodes: Pool,
    /// The token of each delete mark this catalog made and has not ended
    /// ([`Catalog::begin_delete`], [`Catalog::remove_dead_blob`]): an end
    /// removes that mark alone, never one another node made since (once
    /// this one lapsed, or while a lost COMMIT answer was run again).
    marks: Arc<parking_lot::Mutex<HashMap<Digest, i64>>>,
}

impl PostgresCatalog {
    /// Notes the mark `token` of `digest` once a call made it.
    fn made_mark(&self, marked: bool, digest: &Digest, token: i64) {
        if marked {
            self.marks.lock().insert(*digest, token);
        }
    }

    /// Connects, and brings the schema up to date if it is not.
    pub async fn connect(url: &str) -> Result<PostgresCatalog> {
        let pool = pg::pool(url, POOL_SIZE)?;
        pg::reach(&pool, url).await?;
        let catalog = PostgresCatalog { pool, nodes: pg::pool(url, NODE_POOL_SIZE)?, marks: Default::default() };
        catalog.migrate().await?;
        Ok(catalog)
    }

    /// Applies [`MIGRATION`] unless the settings note that it was: a node
    /// starting beside others changes no table (`ALTER TABLE ... IF NOT
    /// EXISTS` takes its lock all the same). A change waits at most
    /// [`DDL_LOCK_WITHIN`] for each lock, and is tried again.
    async fn migrate(&self) -> Result<()> {
        let version = schema_version();
        let version = &version;
        if in_txn!(self.pool, "reading the catalog's schema", |txn| { schema_is(txn, version).await })? {
            return Ok(());
        }
        // In a block of its own: a failure to retry would leave through the
        // `?` inside, past the explanation below.
        let migrated: Result<()> = async {
            in_txn!(self.pool, "migrating the catalog schema", within SCAN_WITHIN, |txn| {
                txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
                if schema_is(txn, version).await? {
                    return Ok(());
                }
                txn.batch_execute(&format!("SET LOCAL lock_timeout = {}", DDL_LOCK_WITHIN.as_millis())).await?;
                txn.batch_execute(MIGRATION).await?;
                txn.execute(
                    "INSERT INTO depot_catalog_settings (name, value) VALUES ('schema', $1) \
                     ON CONFLICT (name) DO UPDATE SET value = $1",
                    &[version],
                )
                .await?;
                Ok(())
            })
        }
        .await;
        migrated.map_err(|e| match e {
            CatalogError::Unavailable(m) => CatalogError::Unavailable(format!(
                "{m} (while bringing the catalog's schema up to date, which waits at most {} s for each table's \
                 lock behind transactions under way)",
                DDL_LOCK_WITHIN.as_secs()
            )),
            e => e,
        })
    }
}

/// The schema [`MIGRATION`] makes, as its settings note it: the first 16
/// hex digits of its SHA-256, so that any change to it is a new schema.
fn schema_version() -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(MIGRATION.as_bytes())[..8])
}

/// Whether the settings note `version` as the schema's.
async fn schema_is(txn: &Transaction<'_>, version: &str) -> std::result::Result<bool, TxnError> {
    let made = txn.query_one("SELECT to_regclass('depot_catalog_settings') IS NOT NULL", &[]).await?;
    if !made.get::<_, bool>(0) {
        return Ok(false);
    }
    let noted = txn.query_opt("SELECT value FROM depot_catalog_settings WHERE name = 'schema'", &[]).await?;
    Ok(noted.is_some_and(|row| row.get::<_, &str>(0) == version))
}

/// Inside a transaction: a database failure (retried when transient) or
/// a catalog answer such as a failed precondition (returned as is).
enum TxnError {
    Pg(PgError),
    Catalog(CatalogError),
}

impl From<tokio_postgres::Error> for TxnError {
    fn from(e: tokio_postgres::Error) -> Self {
        TxnError::Pg(e.into())
    }
}

impl From<CatalogError> for TxnError {
    fn from(e: CatalogError) -> Self {
        TxnError::Catalog(e)
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn grace_millis(grace: Duration) -> i64 {
    i64::try_from(grace.as_millis()).unwrap_or(i64::MAX)
}

/// The advisory-lock stripe of one object key, from the SHA-256 of bucket,
/// NUL, key. Every node must take the same lock for a key, whatever it was
/// built with (the standard library's hasher may change between releases).
fn key_stripe(bucket: &str, key: &str) -> i32 {
    use sha2::Digest as _;
    let hash = sha2::Sha256::new().chain_update(bucket).chain_update([0]).chain_update(key).finalize();
    (u64::from_be_bytes(hash[..8].try_into().expect("eight bytes")) % STRIPES) as i32
}

/// The advisory-lock stripe of one digest.
fn digest_stripe(digest: &Digest) -> i32 {
    (u64::from(u32::from_be_bytes(digest.0[..4].try_into().expect("four bytes"))) % STRIPES) as i32
}

/// Locks the `stripes` of one lock space for the transaction, in stripe
/// order and in one statement. Every transaction locks its keys' stripes
/// first, then its digests' (see [`lock_digests`]), each set in that order,
/// so no two ever wait for each other in a cycle.
async fn lock_stripes(txn: &Transaction<'_>, space: i32, mut stripes: Vec<i32>) -> Result<(), TxnError> {
    stripes.sort_unstable();
    stripes.dedup();
    match stripes.as_slice() {
        [] => {}
        [one] => {
            txn.execute("SELECT pg_advisory_xact_lock($1, $2)", &[&space, one]).await?;
        }
        // PostgreSQL calls a volatile function of the select list after
        // the ORDER BY has sorted the rows.
        _ => {
            let sql =
                "SELECT pg_advisory_xact_lock($1, s) FROM unnest($2::int4[]) WITH ORDINALITY AS t(s, n) ORDER BY n";
            txn.execute(sql, &[&space, &stripes]).await?;
        }
    }
    Ok(())
}

fn blob_from_row(row: &tokio_postgres::Row) -> Result<BlobRecord, TxnError> {
    let digest: Vec<u8> = row.get("digest");
    let digest = Digest(digest.try_into().map_err(|_| CatalogError::Internal("corrupt digest".into()))?);
    Ok(BlobRecord {
        digest,
        size: row.get::<_, i64>("size") as u64,
        locator: row.get("locator"),
        refs: row.get::<_, i64>("refs") as u64,
        unreferenced_since: row.get::<_, Option<i64>>("unreferenced_since").map(|t| t as u64),
    })
}

async fn bucket_exists(txn: &Transaction<'_>, bucket: &str, lock: &str) -> Result<bool, TxnError> {
    let sql = format!("SELECT 1 FROM depot_catalog_buckets WHERE name = $1 {lock}");
    Ok(txn.query_opt(&sql, &[&bucket]).await?.is_some())
}

/// The records of those of `keys` that `bucket` holds, in one query.
async fn read_objects<K: Sync + tokio_postgres::types::ToSql>(
    txn: &Transaction<'_>,
    bucket: &str,
    keys: &[K],
) -> Result<HashMap<String, ObjectRecord>, TxnError> {
    let rows = txn
        .query("SELECT key, record FROM depot_catalog_objects WHERE bucket = $1 AND key = ANY($2)", &[&bucket, &keys])
        .await?;
    let mut found = HashMap::with_capacity(rows.len());
    for row in rows {
        let key: String = row.get(0);
        found.insert(key.clone(), ObjectRecord::decode(row.get::<_, &[u8]>(1), key)?);
    }
    Ok(found)
}

/// The database's clock, in milliseconds since the epoch, as SQL. Blobs'
/// times are read from it, and the grace of dead blobs is counted by it, so
/// the nodes' own clocks need not agree.
macro_rules! db_millis {
    () => {
        "(extract(epoch from now()) * 1000)::bigint"
    };
}

/// How one write changes a digest's references.
#[derive(Default)]
struct RefChange {
    /// References its new records add.
    gained: i64,
    /// References the records it replaces or deletes held.
    lost: i64,
    /// Where it stored the bytes, for a digest it gains.
    stored: Option<BlobRef>,
}

/// Where the catalog has a digest's bytes, after a write that references it.
struct Recorded {
    locator: Vec<u8>,
    /// The write recorded them: no row had the digest before.
    inserted: bool,
}

/// Applies reference changes in digest order; returns where the bytes of
/// each digest that gained references are recorded.
///
/// A digest that gains references gets a row even when it loses as many
/// (a batch that writes a key twice): its bytes were stored, and are
/// collected as any dead blob's would be. One that had a row reports that
/// row's locator even when its count does not change, so bytes written again
/// under another locator are reported redundant.
async fn apply_refs(
    txn: &Transaction<'_>,
    changes: &BTreeMap<Digest, RefChange>,
    stats: &mut CatalogStats,
) -> Result<BTreeMap<Digest, Recorded>, TxnError> {
    // Sent one after the other without waiting for each answer, in digest
    // order, which is the order the rows are locked in.
    let applied = futures::future::try_join_all(changes.iter().map(|(digest, change)| async move {
        let delta = change.gained - change.lost;
        if change.gained > 0 {
            let stored =
                change.stored.as_ref().ok_or_else(|| CatalogError::Internal(format!("no blob given for {digest}")))?;
            let row = txn
                .query_one(
                    concat!(
                        "INSERT INTO depot_catalog_blobs AS b (digest, size, locator, refs, unreferenced_since)
                         VALUES ($1, $2, $3, GREATEST($4::bigint, 0), CASE WHEN $4::bigint > 0 THEN NULL ELSE ",
                        db_millis!(),
                        " END)
                         ON CONFLICT (digest) DO UPDATE SET refs = GREATEST(b.refs + $4::bigint, 0),
                             unreferenced_since = CASE WHEN b.refs + $4::bigint > 0 THEN NULL ELSE ",
                        db_millis!(),
                        " END
                         RETURNING locator, (xmax = 0) AS inserted"
                    ),
                    &[&&digest.0[..], &to_i64(stored.size), &stored.locator, &delta],
                )
                .await?;
            let recorded = Recorded { locator: row.get("locator"), inserted: row.get("inserted") };
            return Ok::<_, TxnError>(Some((*digest, recorded, stored.size)));
        }
        if delta < 0 {
            txn.execute(
                concat!(
                    "UPDATE depot_catalog_blobs
                     SET refs = GREATEST(refs + $2, 0),
                         unreferenced_since = CASE WHEN refs + $2 <= 0 THEN ",
                    db_millis!(),
                    " ELSE unreferenced_since END
                     WHERE digest = $1"
                ),
                &[&&digest.0[..], &delta],
            )
            .await?;
        }
        Ok(None)
    }))
    .await?;
    let mut recorded = BTreeMap::new();
    for (digest, r, size) in applied.into_iter().flatten() {
        if r.inserted {
            stats.blobs += 1;
            stats.blob_bytes += to_i64(size);
        }
        recorded.insert(digest, r);
    }
    Ok(recorded)
}

async fn add_stats(txn: &Transaction<'_>, s: &CatalogStats) -> Result<(), TxnError> {
    if *s == CatalogStats::default() {
        return Ok(());
    }
    let shard = (rand::random::<u32>() % STATS_SHARDS as u32) as i32;
    txn.execute(
        "UPDATE depot_catalog_stats SET objects = objects + $2, logical_bytes = logical_bytes + $3,
         blobs = blobs + $4, blob_bytes = blob_bytes + $5 WHERE shard = $1",
        &[&shard, &s.objects, &s.logical_bytes, &s.blobs, &s.blob_bytes],
    )
    .await?;
    Ok(())
}

/// The error of a write some of whose claims ([`Catalog::claim_blob`])
/// lapsed before it was recorded.
fn lapsed(lost: u64, of: usize) -> CatalogError {
    CatalogError::Unavailable(format!(
        "{lost} of {of} claims on blobs lapsed before their writes were recorded; send them again"
    ))
}

/// Locks `digest` for the transaction: claims and deletes of one digest
/// happen one after the other.
async fn lock_digest(txn: &Transaction<'_>, digest: &Digest) -> Result<(), TxnError> {
    lock_digests(txn, [digest]).await
}

/// [`lock_digest`] for several digests at once.
async fn lock_digests<'d>(
    txn: &Transaction<'_>,
    digests: impl IntoIterator<Item = &'d Digest>,
) -> Result<(), TxnError> {
    lock_stripes(txn, DIGEST_LOCKS, digests.into_iter().map(digest_stripe).collect()).await
}

/// Whether a writer claims `digest`, under the lock of [`lock_digest`].
async fn claimed(txn: &Transaction<'_>, digest: &Digest) -> Result<bool, TxnError> {
    let sql = format!(
        "SELECT 1 FROM depot_catalog_claims WHERE digest = $1 AND since > now() - interval '{CLAIM_LIFE}' LIMIT 1"
    );
    Ok(txn.query_opt(&sql, &[&&digest.0[..]]).await?.is_some())
}

/// Marks a delete of `digest`'s bytes in progress, under the lock of
/// [`lock_digest`], with a token that tells the transaction that made it.
async fn mark_deleting(txn: &Transaction<'_>, digest: &Digest, token: i64) -> Result<(), TxnError> {
    txn.execute(
        "INSERT INTO depot_catalog_deleting (digest, token) VALUES ($1, $2)
             ON CONFLICT (digest) DO UPDATE SET since = now(), token = EXCLUDED.token",
        &[&&digest.0[..], &token],
    )
    .await?;
    Ok(())
}

/// Whether the mark of `digest` is the one `token` made: a transaction run
/// again after a COMMIT whose answer was lost finds its first attempt's.
async fn marked_with(txn: &Transaction<'_>, digest: &Digest, token: i64) -> Result<bool, TxnError> {
    let sql = "SELECT 1 FROM depot_catalog_deleting WHERE digest = $1 AND token = $2";
    Ok(txn.query_opt(sql, &[&&digest.0[..], &token]).await?.is_some())
}

/// Whether another delete of `digest`'s bytes is in progress (one begun
/// longer than [`super::DELETE_MARK_LIFE`] ago is a crashed node's): one deleter at a
/// time, since the end of either would let writers of the digest in while
/// the other's delete could still land.
async fn being_deleted(txn: &Transaction<'_>, digest: &Digest) -> Result<bool, TxnError> {
    let sql = format!("SELECT 1 FROM depot_catalog_deleting WHERE digest = $1 AND since > now() - {}", delete_life());
    Ok(txn.query_opt(&sql, &[&&digest.0[..]]).await?.is_some())
}

/// Locks the given keys for the transaction, in a fixed order.
async fn lock_keys(txn: &Transaction<'_>, bucket_keys: &[(&str, &str)]) -> Result<(), TxnError> {
    lock_stripes(txn, KEY_LOCKS, bucket_keys.iter().map(|(b, k)| key_stripe(b, k)).collect()).await
}

#[async_trait]
impl Catalog for PostgresCatalog {
    async fn create_bucket(&self, bucket: &BucketRecord) -> Result<()> {
        in_txn!(self.pool, "creating a bucket", |txn, replay| {
            let n = txn
                .execute(
                    "INSERT INTO depot_catalog_buckets (name, created, public_read, owner) VALUES ($1, $2, $3, $4)
                         ON CONFLICT DO NOTHING",
                    &[&bucket.name, &to_i64(bucket.created), &bucket.public_read, &bucket.owner],
                )
                .await?;
            if n == 0 {
                // Run again after a COMMIT whose answer was lost: the bucket
                // that attempt made, to the millisecond, is this one's.
                let same = "SELECT 1 FROM depot_catalog_buckets WHERE name = $1 AND created = $2 AND owner = $3";
                if replay
                    && txn.query_opt(same, &[&bucket.name, &to_i64(bucket.created), &bucket.owner]).await?.is_some()
                {
                    return Ok(());
                }
                return Err(CatalogError::BucketExists(bucket.name.clone()).into());
            }
            Ok(())
        })
    }

    async fn set_bucket_public(&self, name: &str, public_read: bool) -> Result<()> {
        in_txn!(self.pool, "changing a bucket", |txn| {
            let n = txn
                .execute("UPDATE depot_catalog_buckets SET public_read = $2 WHERE name = $1", &[&name, &public_read])
                .await?;
            if n == 0 {
                return Err(CatalogError::NoSuchBucket(name.to_string()).into());
            }
            Ok(())
        })
    }

    async fn delete_bucket(&self, name: &str) -> Result<()> {
        in_txn!(self.pool, "deleting a bucket", |txn, replay| {
            if !bucket_exists(txn, name, "FOR UPDATE").await? {
                // Run again after a COMMIT whose answer was lost: the
                // bucket may be gone by that attempt.
                return Err(if replay { unsure() } else { CatalogError::NoSuchBucket(name.to_string()) }.into());
            }
            let any = txn.query_opt("SELECT 1 FROM depot_catalog_objects WHERE bucket = $1 LIMIT 1", &[&name]).await?;
            if any.is_some() {
                return Err(CatalogError::BucketNotEmpty(name.to_string()).into());
            }
            txn.execute("DELETE FROM depot_catalog_buckets WHERE name = $1", &[&name]).await?;
            Ok(())
        })
    }

    async fn bucket(&self, name: &str) -> Result<Option<BucketRecord>> {
        let rows = self.buckets_where(Some(name)).await?;
        Ok(rows.into_iter().next())
    }

    async fn buckets(&self) -> Result<Vec<BucketRecord>> {
        self.buckets_where(None).await
    }

    async fn get_objects(&self, bucket: &str, keys: &[String]) -> Result<Vec<Option<ObjectRecord>>> {
        in_txn!(self.pool, "reading objects", |txn| {
            if !bucket_exists(txn, bucket, "").await? {
                return Err(CatalogError::NoSuchBucket(bucket.to_string()).into());
            }
            let found = read_objects(txn, bucket, keys).await?;
            Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
        })
    }

    async fn put_objects(&self, puts: Vec<ObjectPut>) -> Result<Vec<PutOutcome>> {
        self.put_objects_claimed(puts, &[]).await
    }

    async fn put_objects_claimed(&self, puts: Vec<ObjectPut>, claims: &[ClaimId]) -> Result<Vec<PutOutcome>> {
        let puts = &puts;
        in_txn!(self.pool, "writing objects", |txn, replay| {
            let ids: Vec<(&str, &str)> = puts.iter().map(|p| (p.bucket.as_str(), p.record.key.as_str())).collect();
            lock_keys(txn, &ids).await?;
            let mut stats = CatalogStats::default();
            let mut changes: BTreeMap<Digest, RefChange> = BTreeMap::new();
            let mut replaced = Vec::with_capacity(puts.len());
            // Within one batch a key may repeat: what an earlier entry
            // wrote is what a later one replaces.
            let mut written: HashMap<(&str, &str), ObjectRecord> = Default::default();
            // A batch comes to one bucket: its records are read in one
            // query, as it is checked once.
            let mut stored: HashMap<&str, HashMap<String, ObjectRecord>> = HashMap::new();
            for put in puts {
                if stored.contains_key(put.bucket.as_str()) {
                    continue;
                }
                if !bucket_exists(txn, &put.bucket, "FOR SHARE").await? {
                    return Err(CatalogError::NoSuchBucket(put.bucket.clone()).into());
                }
                let keys: Vec<&str> = ids.iter().filter(|(b, _)| *b == put.bucket).map(|(_, k)| *k).collect();
                stored.insert(&put.bucket, read_objects(txn, &put.bucket, &keys).await?);
            }
            for put in puts {
                let id = (put.bucket.as_str(), put.record.key.as_str());
                let current = match written.get(&id) {
                    Some(r) => Some(r.clone()),
                    None => stored[id.0].get(id.1).cloned(),
                };
                if !put.precondition.check(current.as_ref()) {
                    return Err(if replay { unsure() } else { CatalogError::PreconditionFailed }.into());
                }
                for part in &put.record.parts {
                    let change = changes.entry(part.digest).or_default();
                    change.gained += 1;
                    if change.stored.is_none() {
                        change.stored = put.blobs.iter().find(|b| b.digest == part.digest).cloned();
                    }
                }
                let counted = super::counted(&put.bucket) as i64;
                if let Some(old) = &current {
                    stats.objects -= counted;
                    stats.logical_bytes -= counted * to_i64(old.size);
                    for part in &old.parts {
                        changes.entry(part.digest).or_default().lost += 1;
                    }
                }
                stats.objects += counted;
                stats.logical_bytes += counted * to_i64(put.record.size);
                written.insert(id, put.record.clone());
                replaced.push(current);
            }
            // A digest that gains references is locked as claims and
            // deletes lock it: a delete of its bytes that
            // starts while this transaction runs (begun by this very write,
            // if its COMMIT outlasts the wait for its answer and its bytes
            // are given up as unrecorded) waits for it, and then sees the
            // references it committed.
            lock_digests(txn, changes.iter().filter(|(_, c)| c.gained > 0).map(|(d, _)| d)).await?;
            // The writers' claims end with this commit. Checked under the
            // digests' locks, by the clock's time now (`now()` is when the
            // transaction began, maybe before a wait for those locks, while
            // a collector that held them judged the claim by its own later
            // time): a claim still live here keeps every collector off its
            // bytes until the references are committed.
            if !claims.is_empty() {
                let sql = format!(
                    "DELETE FROM depot_catalog_claims
                     WHERE id = ANY($1) AND since > clock_timestamp() - interval '{CLAIM_LIFE}'"
                );
                let ended = txn.execute(&sql, &[&claims]).await?;
                // A replay finds none: the first attempt's commit ended
                // them, if it wrote every record as this one would.
                let applied = || written.iter().all(|((b, k), r)| stored[b].get(*k) == Some(r));
                if ended < claims.len() as u64 && !(replay && applied()) {
                    return Err(lapsed(claims.len() as u64 - ended, claims.len()).into());
                }
            }
            let recorded = apply_refs(txn, &changes, &mut stats).await?;
            // Sent one after the other without waiting for each answer.
            let encoded: Vec<(&&str, &&str, Vec<u8>)> = written.iter().map(|((b, k), r)| (b, k, r.encode())).collect();
            futures::future::try_join_all(encoded.iter().map(|(bucket, key, record)| async move {
                txn.execute(
                    "INSERT INTO depot_catalog_objects (bucket, key, record) VALUES ($1, $2, $3)
                         ON CONFLICT (bucket, key) DO UPDATE SET record = EXCLUDED.record",
                    &[bucket, key, record],
                )
                .await
            }))
            .await?;
            add_stats(txn, &stats).await?;
            let mut outcomes = Vec::with_capacity(puts.len());
            // Only the first entry to bring a new blob stored it.
            let mut claimed = std::collections::HashSet::new();
            for (put, replaced) in puts.iter().zip(replaced) {
                let mut deduplicated = true;
                let mut redundant = Vec::new();
                for part in &put.record.parts {
                    let Some(recorded) = recorded.get(&part.digest) else { continue };
                    if recorded.inserted {
                        deduplicated &= !claimed.insert(part.digest);
                    }
                    // Bytes of the digest under another locator, recorded
                    // before or by an earlier entry of the batch.
                    if let Some(b) = put.blobs.iter().find(|b| b.digest == part.digest)
                        && b.locator != recorded.locator
                        && !redundant.contains(b)
                    {
                        redundant.push(b.clone());
                    }
                }
                outcomes.push(PutOutcome { replaced, deduplicated, redundant });
            }
            Ok(outcomes)
        })
    }

    async fn delete_objects(
        &self,
        bucket: &str,
        keys: &[String],
        precondition: &Precondition,
    ) -> Result<Vec<Option<ObjectRecord>>> {
        in_txn!(self.pool, "deleting objects", |txn, replay| {
            if !bucket_exists(txn, bucket, "FOR SHARE").await? {
                return Err(CatalogError::NoSuchBucket(bucket.to_string()).into());
            }
            let ids: Vec<(&str, &str)> = keys.iter().map(|k| (bucket, k.as_str())).collect();
            lock_keys(txn, &ids).await?;
            let counted = super::counted(bucket) as i64;
            let mut stats = CatalogStats::default();
            let mut changes: BTreeMap<Digest, RefChange> = BTreeMap::new();
            let mut out = Vec::with_capacity(keys.len());
            let mut gone = std::collections::HashSet::new();
            let stored = read_objects(txn, bucket, keys).await?;
            for key in keys {
                let current = if gone.contains(key) { None } else { stored.get(key).cloned() };
                if replay && current.is_none() && !gone.contains(key) {
                    return Err(unsure().into());
                }
                if let Some(c) = &current {
                    if !precondition.check(Some(c)) {
                        return Err(if replay { unsure() } else { CatalogError::PreconditionFailed }.into());
                    }
                    stats.objects -= counted;
                    stats.logical_bytes -= counted * to_i64(c.size);
                    for part in &c.parts {
                        changes.entry(part.digest).or_default().lost += 1;
                    }
                    gone.insert(key.clone());
                }
                out.push(current);
            }
            let gone: Vec<&String> = gone.iter().collect();
            txn.execute("DELETE FROM depot_catalog_objects WHERE bucket = $1 AND key = ANY($2)", &[&bucket, &gone])
                .await?;
            apply_refs(txn, &changes, &mut stats).await?;
            add_stats(txn, &stats).await?;
            Ok(out)
        })
    }

    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        in_txn!(self.pool, "listing objects", |txn| { list_page(txn, bucket, query).await })
    }

    async fn get_blobs(&self, digests: &[Digest]) -> Result<Vec<Option<BlobRecord>>> {
        let wanted: Vec<&[u8]> = digests.iter().map(|d| &d.0[..]).collect();
        let wanted = &wanted;
        in_txn!(self.pool, "reading blob records", |txn| {
            let rows = txn.query("SELECT * FROM depot_catalog_blobs WHERE digest = ANY($1)", &[wanted]).await?;
            let mut found = std::collections::HashMap::with_capacity(rows.len());
            for row in &rows {
                let b = blob_from_row(row)?;
                found.insert(b.digest, b);
            }
            Ok(digests.iter().map(|d| found.get(d).cloned()).collect())
        })
    }

    async fn dead_blobs(&self, grace: Duration, limit: usize) -> Result<Vec<BlobRecord>> {
        let grace = grace_millis(grace);
        in_txn!(self.pool, "finding dead blobs", |txn| {
            // The claims of writers whose node crashed go with each pass.
            let sql = format!("DELETE FROM depot_catalog_claims WHERE since <= now() - interval '{CLAIM_LIFE}'");
            txn.execute(&sql, &[]).await?;
            let rows = txn
                .query(
                    concat!(
                        "SELECT * FROM depot_catalog_blobs WHERE refs = 0 AND unreferenced_since <= ",
                        db_millis!(),
                        " - $1 ORDER BY unreferenced_since LIMIT $2"
                    ),
                    &[&grace, &(limit as i64)],
                )
                .await?;
            rows.iter().map(blob_from_row).collect()
        })
    }

    async fn remove_dead_blob(&self, digest: &Digest, grace: Option<Duration>) -> Result<bool> {
        let grace = grace.map(grace_millis);
        let token = rand::random::<i64>() | 1;
        in_txn!(self.pool, "removing a dead blob", |txn, replay| {
            lock_digest(txn, digest).await?;
            // The first attempt's COMMIT may have been applied, its answer
            // lost: if its mark is there, the blob is this call's to delete
            // (else its mark would keep writers of the digest waiting, and
            // its bytes would stay).
            if replay && marked_with(txn, digest, token).await? {
                return Ok(true);
            }
            if claimed(txn, digest).await? || being_deleted(txn, digest).await? {
                return Ok(false);
            }
            let row = txn
                .query_opt(
                    concat!(
                        "DELETE FROM depot_catalog_blobs WHERE digest = $1 AND refs = 0
                         AND ($2::bigint IS NULL OR unreferenced_since <= ",
                        db_millis!(),
                        " - $2) RETURNING size"
                    ),
                    &[&&digest.0[..], &grace],
                )
                .await?;
            let Some(row) = row else { return Ok(false) };
            let stats = CatalogStats { blobs: -1, blob_bytes: -row.get::<_, i64>(0), ..Default::default() };
            add_stats(txn, &stats).await?;
            mark_deleting(txn, digest, token).await?;
            Ok(true)
        })
        .inspect(|marked| self.made_mark(*marked, digest, token))
    }

    async fn claim_blobs(&self, digests: &[Digest]) -> Result<Vec<ClaimId>> {
        // The writer picks the claims' ids, so a replay after a COMMIT whose
        // answer was lost finds the claims made rather than adding more
        // that nobody would release. Negative: apart from the ids earlier
        // versions drew from the table's sequence.
        let ids: Vec<ClaimId> = digests.iter().map(|_| rand::random::<i64>() | i64::MIN).collect();
        let mut waiting: Vec<(ClaimId, &Digest)> = ids.iter().copied().zip(digests).collect();
        while !waiting.is_empty() {
            let (asked, digests): (Vec<ClaimId>, Vec<&[u8]>) = waiting.iter().map(|(id, d)| (*id, &d.0[..])).unzip();
            let claimed: Result<std::collections::HashSet<ClaimId>> = async {
                in_txn!(self.pool, "claiming blobs", |txn| {
                    lock_digests(txn, waiting.iter().map(|(_, d)| *d)).await?;
                    // A delete in progress too long ago is a crashed node's.
                    let stale = format!(
                        "DELETE FROM depot_catalog_deleting WHERE digest = ANY($1) AND since <= now() - {}",
                        delete_life()
                    );
                    // Under the locks, sent together without waiting for each
                    // answer (a claim comes before every upload's commit). Should
                    // the server run them out of order, a claim is missed and
                    // tried again, never taken for made: the answer is whether
                    // the claim's row is there. Committed without waiting for
                    // the disk: a claim a crash lost is found lapsed when its
                    // write is recorded (`put_objects_claimed`), which then fails.
                    let (_, _, _, claimed) = futures::try_join!(
                        async { txn.batch_execute("SET LOCAL synchronous_commit = off").await.map_err(TxnError::from) },
                        async { txn.execute(&stale, &[&digests]).await.map_err(TxnError::from) },
                        async {
                            txn.execute(
                                "INSERT INTO depot_catalog_claims (id, digest)
                             SELECT t.id, t.digest FROM unnest($1::int8[], $2::bytea[]) AS t(id, digest)
                             WHERE NOT EXISTS (SELECT 1 FROM depot_catalog_deleting d WHERE d.digest = t.digest)
                             ON CONFLICT (id) DO NOTHING",
                                &[&asked, &digests],
                            )
                            .await
                            .map_err(TxnError::from)
                        },
                        async {
                            let sql = "SELECT id FROM depot_catalog_claims WHERE id = ANY($1)";
                            txn.query(sql, &[&asked]).await.map_err(TxnError::from)
                        },
                    )?;
                    Ok(claimed.iter().map(|row| row.get::<_, i64>(0)).collect())
                })
            }
            .await;
            let claimed = match claimed {
                Ok(claimed) => claimed,
                Err(e) => {
                    // Those made (any of them, a lost answer's included) go
                    // now rather than keep their digests from the
                    // collectors until they lapse.
                    let _ = self.release_claims(&ids).await;
                    return Err(e);
                }
            };
            // The rest wait for the deletes of their digests to end.
            waiting.retain(|(id, _)| !claimed.contains(id));
            if !waiting.is_empty() {
                tokio::time::sleep(DELETE_POLL).await;
            }
        }
        Ok(ids)
    }

    async fn release_claims(&self, claims: &[ClaimId]) -> Result<()> {
        in_txn!(self.pool, "releasing claims", |txn| {
            txn.execute("DELETE FROM depot_catalog_claims WHERE id = ANY($1)", &[&claims]).await?;
            Ok(())
        })
    }

    async fn renew_claims(&self, claims: &[ClaimId]) -> Result<()> {
        let renewed = in_txn!(self.pool, "renewing claims", |txn| {
            let sql = format!(
                "UPDATE depot_catalog_claims SET since = now()
                 WHERE id = ANY($1) AND since > clock_timestamp() - interval '{CLAIM_LIFE}'"
            );
            Ok(txn.execute(&sql, &[&claims]).await?)
        })?;
        if renewed < claims.len() as u64 {
            return Err(lapsed(claims.len() as u64 - renewed, claims.len()));
        }
        Ok(())
    }

    async fn begin_delete(&self, blob: &BlobRef) -> Result<bool> {
        let token = rand::random::<i64>() | 1;
        in_txn!(self.pool, "starting a delete", |txn, replay| {
            lock_digest(txn, &blob.digest).await?;
            // The first attempt's COMMIT may have been applied, its answer
            // lost: its mark makes the delete this call's (else the mark
            // would keep writers of the digest waiting for minutes).
            if replay && marked_with(txn, &blob.digest, token).await? {
                return Ok(true);
            }
            let recorded = txn
                .query_opt(
                    "SELECT 1 FROM depot_catalog_blobs WHERE digest = $1 AND locator = $2",
                    &[&&blob.digest.0[..], &blob.locator],
                )
                .await?;
            if recorded.is_some() || claimed(txn, &blob.digest).await? || being_deleted(txn, &blob.digest).await? {
                return Ok(false);
            }
            mark_deleting(txn, &blob.digest, token).await?;
            Ok(true)
        })
        .inspect(|marked| self.made_mark(*marked, &blob.digest, token))
    }

    async fn end_delete(&self, digest: &Digest) -> Result<()> {
        let Some(token) = self.marks.lock().remove(digest) else { return Ok(()) };
        in_txn!(self.pool, "ending a delete", |txn| {
            txn.execute(
                "DELETE FROM depot_catalog_deleting WHERE digest = $1 AND token = $2",
                &[&&digest.0[..], &token],
            )
            .await?;
            Ok(())
        })
    }

    async fn node_seen(&self, node: &str) -> Result<()> {
        in_txn!(self.nodes, "noting a node", |txn| {
            txn.execute(
                "INSERT INTO depot_catalog_nodes (name) VALUES ($1) ON CONFLICT (name) DO UPDATE SET seen = now()",
                &[&node],
            )
            .await?;
            Ok(())
        })
    }

    async fn node_gone(&self, node: &str) -> Result<()> {
        in_txn!(self.nodes, "noting a node gone", |txn| {
            txn.execute("DELETE FROM depot_catalog_nodes WHERE name = $1", &[&node]).await?;
            Ok(())
        })
    }

    async fn live_nodes(&self, within: Duration) -> Result<Vec<String>> {
        let seconds = within.as_secs_f64();
        in_txn!(self.nodes, "listing nodes", |txn| {
            let rows = txn
                .query(
                    "SELECT name FROM depot_catalog_nodes WHERE seen > now() - make_interval(secs => $1) ORDER BY name",
                    &[&seconds],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    async fn engine_marker(&self) -> Result<Option<String>> {
        in_txn!(self.pool, "reading the catalog's engine", |txn| {
            let row = txn.query_opt("SELECT value FROM depot_catalog_settings WHERE name = 'engine'", &[]).await?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    async fn set_engine_marker(&self, previous: Option<&str>, marker: &str) -> Result<bool> {
        in_txn!(self.pool, "recording the catalog's engine", |txn| {
            let changed = match previous {
                None => {
                    txn.execute(
                        "INSERT INTO depot_catalog_settings (name, value) VALUES ('engine', $1) ON CONFLICT DO NOTHING",
                        &[&marker],
                    )
                    .await?
                }
                Some(previous) => {
                    txn.execute(
                        "UPDATE depot_catalog_settings SET value = $1 WHERE name = 'engine' AND value = $2",
                        &[&marker, &previous],
                    )
                    .await?
                }
            };
            Ok(changed == 1)
        })
    }

    async fn list_blobs(&self, after: Option<Digest>, limit: usize) -> Result<Vec<BlobRecord>> {
        let after = after.map(|d| d.0.to_vec()).unwrap_or_default();
        let after = &after;
        in_txn!(self.pool, "listing blobs", within SCAN_WITHIN, |txn| {
            let rows = txn
                .query(
                    "SELECT * FROM depot_catalog_blobs WHERE digest > $1 ORDER BY digest LIMIT $2",
                    &[after, &(limit as i64)],
                )
                .await?;
            rows.iter().map(blob_from_row).collect()
        })
    }

    async fn set_locators(&self, moved: &[(Digest, Locator)]) -> Result<()> {
        let digests: Vec<&[u8]> = moved.iter().map(|(d, _)| &d.0[..]).collect();
        let locators: Vec<&[u8]> = moved.iter().map(|(_, l)| &l[..]).collect();
        let (digests, locators) = (&digests, &locators);
        in_txn!(self.pool, "moving blobs", within SCAN_WITHIN, |txn| {
            txn.execute(
                "UPDATE depot_catalog_blobs AS b SET locator = m.locator
                     FROM unnest($1::bytea[], $2::bytea[]) AS m(digest, locator) WHERE b.digest = m.digest",
                &[digests, locators],
            )
            .await?;
            Ok(())
        })
    }

    async fn set_refs(&self, counted: &[(Digest, u64)]) -> Result<()> {
        let digests: Vec<&[u8]> = counted.iter().map(|(d, _)| &d.0[..]).collect();
        let refs: Vec<i64> = counted.iter().map(|(_, n)| to_i64(*n)).collect();
        let (digests, refs) = (&digests, &refs);
        in_txn!(self.pool, "setting reference counts", within SCAN_WITHIN, |txn| {
            txn.execute(
                concat!(
                    "UPDATE depot_catalog_blobs AS b SET refs = c.refs,
                         unreferenced_since = CASE WHEN c.refs = 0 THEN COALESCE(b.unreferenced_since, ",
                    db_millis!(),
                    ") END
                     FROM unnest($1::bytea[], $2::bigint[]) AS c(digest, refs) WHERE b.digest = c.digest"
                ),
                &[digests, refs],
            )
            .await?;
            Ok(())
        })
    }

    async fn set_stats(&self, stats: CatalogStats) -> Result<()> {
        in_txn!(self.pool, "setting totals", within SCAN_WITHIN, |txn| {
            txn.execute(
                "UPDATE depot_catalog_stats SET objects = 0, logical_bytes = 0, blobs = 0, blob_bytes = 0",
                &[],
            )
            .await?;
            add_stats(txn, &stats).await
        })
    }

    async fn stats(&self) -> Result<CatalogStats> {
        in_txn!(self.pool, "reading totals", |txn| {
            let row = txn
                    .query_one(
                        "SELECT COALESCE(SUM(objects), 0)::bigint, COALESCE(SUM(logical_bytes), 0)::bigint,
                         COALESCE(SUM(blobs), 0)::bigint, COALESCE(SUM(blob_bytes), 0)::bigint FROM depot_catalog_stats",
                        &[],
                    )
                    .await?;
            Ok(CatalogStats {
                objects: row.get(0),
                logical_bytes: row.get(1),
                blobs: row.get(2),
                blob_bytes: row.get(3),
            })
        })
    }
}

impl PostgresCatalog {
    async fn buckets_where(&self, name: Option<&str>) -> Result<Vec<BucketRecord>> {
        in_txn!(self.pool, "reading buckets", |txn| {
            let rows = txn
                .query(
                    "SELECT name, created, public_read, owner FROM depot_catalog_buckets
                         WHERE $1::text IS NULL OR name = $1 ORDER BY name",
                    &[&name],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| BucketRecord {
                    name: r.get(0),
                    created: r.get::<_, i64>(1) as u64,
                    public_read: r.get(2),
                    owner: r.get(3),
                })
                .collect())
        })
    }
}

/// Rows a listing asks for right after a common prefix.
const PAST_PREFIX_ROWS: i64 = 16;

/// One page of a listing, rolling keys up to common prefixes; a run of
/// keys under one common prefix is skipped with a fresh query starting
/// past it, so a page costs a few index range scans however many keys
/// hide under its prefixes.
async fn list_page(txn: &Transaction<'_>, bucket: &str, query: &ListQuery) -> Result<ListPage, TxnError> {
    if !bucket_exists(txn, bucket, "").await? {
        return Err(CatalogError::NoSuchBucket(bucket.to_string()).into());
    }
    let limit = query.limit.max(1);
    // The lower bound: past a key, or from the first key past a common
    // prefix.
    let mut after: Option<String> = None;
    let mut from: Option<String> = None;
    match &query.after {
        Some(a) if query.after_is_common_prefix() => match past(a) {
            Some(p) => from = Some(p),
            None => return Ok(ListPage::default()),
        },
        a => after = a.clone(),
    }
    let like = format!("{}%", query.prefix.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
    let mut page = ListPage::default();
    let mut restarted = false;
    loop {
        // Past a common prefix, the next key is often another one (a
        // folder of folders): a few rows are asked first, not a page of
        // records read to use one.
        let want = (limit - page.objects.len() - page.prefixes.len()) as i64 + 1;
        let want = if restarted { want.min(PAST_PREFIX_ROWS) } else { want };
        let rows = txn
            .query(
                "SELECT key, record FROM depot_catalog_objects
                 WHERE bucket = $1 AND key LIKE $2 AND ($3::text IS NULL OR key > $3)
                   AND ($4::text IS NULL OR key >= $4)
                 ORDER BY key LIMIT $5",
                &[&bucket, &like, &after, &from, &want],
            )
            .await?;
        if rows.is_empty() {
            return Ok(page);
        }
        restarted = false;
        for row in &rows {
            let key: String = row.get(0);
            if page.objects.len() + page.prefixes.len() >= limit {
                page.next =
                    page.objects.last().map(|o| o.key.clone()).into_iter().chain(page.prefixes.last().cloned()).max();
                return Ok(page);
            }
            if let Some(common) = query.common_prefix(&key).map(str::to_string) {
                (after, from) = (None, past(&common));
                let last = from.is_none();
                page.prefixes.push(common);
                if last {
                    return Ok(page);
                }
                restarted = true;
                break;
            }
            (after, from) = (Some(key.clone()), None);
            page.objects.push(ObjectRecord::decode(row.get::<_, &[u8]>(1), key)?);
        }
        if !restarted && (rows.len() as i64) < want {
            return Ok(page);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_takes_the_same_lock_on_every_build() {
        // The first 8 bytes of SHA-256("files\0k"), as any build computes
        // them, modulo 512.
        assert_eq!(key_stripe("files", "k"), 382);
        assert_ne!(key_stripe("files", "k"), key_stripe("files", "k2"));
        assert_ne!(key_stripe("a", "bc"), key_stripe("ab", "c"));
        let digest = Digest([0xff; 32]);
        assert_eq!(digest_stripe(&digest), 511);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let url = pg::fresh_test_database().await;
        super::super::conformance::run_all(&PostgresCatalog::connect(&url).await.unwrap()).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn two_nodes_share_one_catalog() {
        let url = pg::fresh_test_database().await;
        let (a, b) = futures::join!(PostgresCatalog::connect(&url), PostgresCatalog::connect(&url));
        let (a, b) = (a.unwrap(), b.unwrap());
        a.create_bucket(&BucketRecord::new("shared", "", false)).await.unwrap();
        assert!(b.bucket("shared").await.unwrap().is_some());
        assert!(matches!(
            b.create_bucket(&BucketRecord::new("shared", "", false)).await,
            Err(CatalogError::BucketExists(_))
        ));
    }

    /// A renewed claim counts again from now; one past its life cannot be
    /// renewed (a collector may have taken its bytes meanwhile).
    #[tokio::test(flavor = "multi_thread")]
    async fn claims_are_renewed_until_they_lapse() {
        let url = pg::fresh_test_database().await;
        let catalog = PostgresCatalog::connect(&url).await.unwrap();
        let (a, b) = (Digest([1; 32]), Digest([2; 32]));
        let claims = catalog.claim_blobs(&[a, b]).await.unwrap();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let age = |id: ClaimId, minutes: i32| {
            let client = &client;
            async move {
                let sql = "UPDATE depot_catalog_claims SET since = now() - make_interval(mins => $2) WHERE id = $1";
                assert_eq!(client.execute(sql, &[&id, &minutes]).await.unwrap(), 1);
            }
        };
        age(claims[0], 9).await;
        catalog.renew_claims(&claims).await.unwrap();
        let fresh = "SELECT count(*) FROM depot_catalog_claims WHERE since > now() - interval '1 minute'";
        assert_eq!(client.query_one(fresh, &[]).await.unwrap().get::<_, i64>(0), 2, "both count from now");
        age(claims[1], 11).await;
        let lapsed = catalog.renew_claims(&claims).await;
        assert!(matches!(lapsed, Err(CatalogError::Unavailable(ref m)) if m.contains("1 of 2")), "{lapsed:?}");
        catalog.release_claims(&claims).await.unwrap();
        assert!(catalog.renew_claims(&claims).await.is_err(), "released claims are not renewed");
        catalog.renew_claims(&[]).await.unwrap();
    }

    /// The longest key allowed, of characters that do not compress, in a
    /// bucket of the longest name: its index entry fits.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_longest_key_in_the_longest_bucket_fits_the_index() {
        use super::super::conformance::{blob, bucket, put};
        let url = pg::fresh_test_database().await;
        let catalog = PostgresCatalog::connect(&url).await.unwrap();
        let name = "b".repeat(63);
        catalog.create_bucket(&bucket(&name)).await.unwrap();
        // Printable ASCII at random.
        let random_key =
            |len: usize| -> String { (0..len).map(|_| char::from(b'!' + rand::random::<u8>() % 94)).collect() };
        let key = random_key(MAX_KEY_BYTES);
        catalog.put_objects(vec![put(&name, &key, &[blob(1, 10)])]).await.unwrap();
        assert!(catalog.get_objects(&name, std::slice::from_ref(&key)).await.unwrap()[0].is_some());
        // And one far longer does not: what the limit keeps out.
        assert!(catalog.put_objects(vec![put(&name, &random_key(2 * MAX_KEY_BYTES), &[blob(2, 10)])]).await.is_err());
    }

    /// A put ends its writer's claims as it commits, and commits nothing if
    /// one of them has lapsed.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_put_ends_its_claims_and_fails_if_one_lapsed() {
        use super::super::conformance::{blob, bucket, put};
        let url = pg::fresh_test_database().await;
        let catalog = PostgresCatalog::connect(&url).await.unwrap();
        catalog.create_bucket(&bucket("files")).await.unwrap();
        let (x, y) = (blob(1, 10), blob(2, 20));
        let claims = catalog.claim_blobs(&[x.digest, y.digest]).await.unwrap();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let claims_left = || async {
            client.query_one("SELECT count(*) FROM depot_catalog_claims", &[]).await.unwrap().get::<_, i64>(0)
        };
        let aged = "UPDATE depot_catalog_claims SET since = now() - interval '11 minutes' WHERE id = $1";
        client.execute(aged, &[&claims[1]]).await.unwrap();
        let puts = || vec![put("files", "x", std::slice::from_ref(&x)), put("files", "y", std::slice::from_ref(&y))];
        let lapsed = catalog.put_objects_claimed(puts(), &claims).await;
        assert!(matches!(lapsed, Err(CatalogError::Unavailable(ref m)) if m.contains("1 of 2")), "{lapsed:?}");
        assert_eq!(catalog.get_objects("files", &["x".into(), "y".into()]).await.unwrap(), vec![None, None]);
        assert_eq!(catalog.get_blobs(&[x.digest]).await.unwrap(), vec![None]);
        assert_eq!(claims_left().await, 2, "a failed put ends no claim");

        let claims = catalog.claim_blobs(&[x.digest, y.digest]).await.unwrap();
        catalog.put_objects_claimed(puts(), &claims).await.unwrap();
        assert!(catalog.get_objects("files", &["x".into(), "y".into()]).await.unwrap().iter().all(Option::is_some));
        let live = "SELECT count(*) FROM depot_catalog_claims WHERE id = ANY($1)";
        assert_eq!(client.query_one(live, &[&&claims[..]]).await.unwrap().get::<_, i64>(0), 0, "the commit ended them");
    }

    /// A claim that lapses while its put waits for a digest's lock (held
    /// by a collector, say) fails the put: it is judged by the time the
    /// lock was had, not the time the put's transaction began.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_claim_that_lapses_while_its_put_waits_for_the_lock_fails_it() {
        use super::super::conformance::{blob, bucket, put};
        let url = pg::fresh_test_database().await;
        let catalog = PostgresCatalog::connect(&url).await.unwrap();
        catalog.create_bucket(&bucket("files")).await.unwrap();
        let x = blob(3, 10);
        let claim = catalog.claim_blobs(&[x.digest]).await.unwrap()[0];
        let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let aged =
            format!("UPDATE depot_catalog_claims SET since = now() - interval '{CLAIM_LIFE}' + interval '1 second'");
        client.execute(&aged, &[]).await.unwrap();
        let holder = client.transaction().await.unwrap();
        holder
            .execute("SELECT pg_advisory_xact_lock($1, $2)", &[&DIGEST_LOCKS, &digest_stripe(&x.digest)])
            .await
            .unwrap();
        let putting = tokio::spawn({
            let catalog = catalog.clone();
            async move { catalog.put_objects_claimed(vec![put("files", "x", std::slice::from_ref(&x))], &[claim]).await }
        });
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!putting.is_finished(), "the put waits for the digest's lock");
        holder.commit().await.unwrap();
        let lapsed = putting.await.unwrap();
        assert!(matches!(lapsed, Err(CatalogError::Unavailable(ref m)) if m.contains("lapsed")), "{lapsed:?}");
        assert_eq!(catalog.get_objects("files", &["x".into()]).await.unwrap(), vec![None]);
    }

    /// The engine marker is set once, and changed only by whoever read the
    /// one it replaces.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_engine_marker_is_set_by_one_node() {
        let url = pg::fresh_test_database().await;
        let (a, b) = futures::join!(PostgresCatalog::connect(&url), PostgresCatalog::connect(&url));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.engine_marker().await.unwrap(), None);
        let (set_a, set_b) = futures::join!(a.set_engine_marker(None, "fs\n"), b.set_engine_marker(None, "s3\n"));
        assert!(set_a.unwrap() ^ set_b.unwrap(), "both or neither of two first markers were recorded");
        let first = b.engine_marker().await.unwrap().unwrap();
        assert!(!a.set_engine_marker(Some("hybrid\n"), "postgres\n").await.unwrap());
        assert!(a.set_engine_marker(Some(&first), "postgres\n").await.unwrap());
        assert_eq!(b.engine_marker().await.unwrap().as_deref(), Some("postgres\n"));
    }

    /// Node `a` writes and `b` collects the same bytes: `b` deletes only
    /// bytes no writer claims, and a writer's claim waits while `b` deletes.
    #[tokio::test(flavor = "multi_thread")]
    async fn writers_and_collectors_on_two_nodes_keep_apart() {
        use super::super::CatalogExt;
        use super::super::conformance::{blob, bucket, put};
        let url = pg::fresh_test_database().await;
        let (a, b) = futures::join!(PostgresCatalog::connect(&url), PostgresCatalog::connect(&url));
        let (a, b) = (a.unwrap(), b.unwrap());
        a.create_bucket(&bucket("shared")).await.unwrap();
        let x = blob(7, 10);
        a.put_object(put("shared", "k", std::slice::from_ref(&x))).await.unwrap();
        a.delete_object("shared", "k", &Precondition::default()).await.unwrap();

        // A claim keeps the dead blob, its bytes and any leftover of them.
        let claim = a.claim_blobs(&[x.digest]).await.unwrap()[0];
        assert!(!b.remove_dead_blob(&x.digest, None).await.unwrap());
        assert!(!b.begin_delete(&BlobRef { locator: vec![99], ..x.clone() }).await.unwrap());
        a.release_claims(&[claim]).await.unwrap();
        // Bytes the record points at are not leftovers.
        assert!(!b.begin_delete(&x).await.unwrap());

        // Once `b` has removed the record, a claim waits for its delete,
        // and no other delete of the digest begins (its end would let the
        // claim through while `b`'s delete could still land).
        // Claimed with it, a digest nobody deletes is claimed meanwhile.
        let z = blob(9, 10);
        a.put_object(put("shared", "z", std::slice::from_ref(&z))).await.unwrap();
        a.delete_object("shared", "z", &Precondition::default()).await.unwrap();
        assert!(b.remove_dead_blob(&x.digest, None).await.unwrap());
        assert!(!a.begin_delete(&BlobRef { locator: vec![98], ..x.clone() }).await.unwrap());
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.claim_blobs(&[x.digest, z.digest]).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "a claim went on while another node deleted the bytes");
        assert!(!b.remove_dead_blob(&z.digest, None).await.unwrap(), "the digest beside it was not claimed");
        b.end_delete(&x.digest).await.unwrap();
        let claims = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap();
        assert_eq!(claims.len(), 2);
        a.release_claims(&claims).await.unwrap();
        assert!(b.remove_dead_blob(&z.digest, None).await.unwrap(), "released claims still kept the blob");
        b.end_delete(&z.digest).await.unwrap();

        // A leftover's delete holds claims back the same way, and other
        // deletes of the digest too.
        let y = blob(8, 10);
        assert!(b.begin_delete(&y).await.unwrap());
        assert!(!a.begin_delete(&BlobRef { locator: vec![97], ..y.clone() }).await.unwrap());
        a.put_object(put("shared", "y", std::slice::from_ref(&y))).await.unwrap();
        a.delete_object("shared", "y", &Precondition::default()).await.unwrap();
        assert!(!a.remove_dead_blob(&y.digest, None).await.unwrap());
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.claim_blobs(&[y.digest]).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished());
        b.end_delete(&y.digest).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap();
    }

    /// A delete that outlasted its mark ends no mark another node made
    /// since: the end of each removes its own.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_delete_ends_its_own_mark_only() {
        let url = pg::fresh_test_database().await;
        let (a, b) = futures::join!(PostgresCatalog::connect(&url), PostgresCatalog::connect(&url));
        let (a, b) = (a.unwrap(), b.unwrap());
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let marks = || async {
            client.query_one("SELECT count(*) FROM depot_catalog_deleting", &[]).await.unwrap().get::<_, i64>(0)
        };
        let x = super::super::conformance::blob(5, 10);
        assert!(a.begin_delete(&x).await.unwrap());
        assert!(!b.begin_delete(&x).await.unwrap(), "one delete of a digest at a time");
        let lapse = "UPDATE depot_catalog_deleting SET since = now() - interval '1 hour'";
        client.execute(lapse, &[]).await.unwrap();
        assert!(b.begin_delete(&x).await.unwrap(), "a lapsed mark is a crashed node's");
        a.end_delete(&x.digest).await.unwrap();
        assert_eq!(marks().await, 1, "the end of the lapsed delete removed the other node's mark");
        b.end_delete(&x.digest).await.unwrap();
        assert_eq!(marks().await, 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_unreachable_server_is_unavailable() {
        match PostgresCatalog::connect("postgres://depot:depot@127.0.0.1:1/depot").await {
            Err(CatalogError::Unavailable(_)) => {}
            Err(other) => panic!("expected Unavailable, got {other}"),
            Ok(_) => panic!("connected to a closed port"),
        }
    }

    #[tokio::test]
    async fn nodes_are_seen_until_they_stop_or_fall_silent() {
        let url = pg::fresh_test_database().await;
        let c = PostgresCatalog::connect(&url).await.unwrap();
        assert!(c.live_nodes(Duration::from_secs(20)).await.unwrap().is_empty());
        c.node_seen("a").await.unwrap();
        c.node_seen("b").await.unwrap();
        c.node_seen("a").await.unwrap();
        assert_eq!(c.live_nodes(Duration::from_secs(20)).await.unwrap(), ["a", "b"]);
        c.node_gone("a").await.unwrap();
        assert_eq!(c.live_nodes(Duration::from_secs(20)).await.unwrap(), ["b"]);
        // One not heard from within the window is taken for stopped.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(c.live_nodes(Duration::from_millis(200)).await.unwrap().is_empty());
    }

    /// Every session carries the server-side bounds, and a scan raises its
    /// own statements' for its transaction alone.
    #[tokio::test(flavor = "multi_thread")]
    async fn sessions_are_bounded_on_the_server() {
        let url = pg::fresh_test_database().await;
        let c = PostgresCatalog::connect(&url).await.unwrap();
        let show = |pool: Pool, within: Duration| async move {
            in_txn!(pool, "reading the bounds", within within, |txn| {
                let sql = "SELECT current_setting('statement_timeout'), \
                           current_setting('idle_in_transaction_session_timeout')";
                let row = txn.query_one(sql, &[]).await?;
                Ok((row.get::<_, String>(0), row.get::<_, String>(1)))
            })
        };
        for pool in [c.pool.clone(), c.nodes.clone()] {
            assert_eq!(show(pool, pg::ANSWER_WITHIN).await.unwrap(), ("14s".to_string(), "5s".to_string()));
        }
        assert_eq!(show(c.pool.clone(), SCAN_WITHIN).await.unwrap().0, "10min");
        let after = show(c.pool.clone(), pg::ANSWER_WITHIN).await.unwrap().0;
        assert_eq!(after, "14s", "the scan's bound ended with it");
    }

    /// A node that froze inside a transaction holds its locks for
    /// [`pg::IDLE_IN_TRANSACTION_WITHIN`], not for good: a write of the same
    /// key on another node then goes through.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_node_frozen_in_a_transaction_holds_others_up_for_seconds() {
        use super::super::conformance::{blob, bucket, put};
        let url = pg::fresh_test_database().await;
        let (frozen, live) =
            (PostgresCatalog::connect(&url).await.unwrap(), PostgresCatalog::connect(&url).await.unwrap());
        live.create_bucket(&bucket("files")).await.unwrap();
        let mut client = frozen.pool.get().await.unwrap();
        let holder = client.transaction().await.unwrap();
        holder.execute("SELECT pg_advisory_xact_lock($1, $2)", &[&KEY_LOCKS, &key_stripe("files", "k")]).await.unwrap();
        let began = std::time::Instant::now();
        live.put_objects(vec![put("files", "k", &[blob(1, 10)])]).await.unwrap();
        let waited = began.elapsed();
        assert!(waited >= pg::IDLE_IN_TRANSACTION_WITHIN - Duration::from_millis(500), "the lock held: {waited:?}");
        assert!(live.get_objects("files", &["k".into()]).await.unwrap()[0].is_some());
        let ended = holder.execute("SELECT 1", &[]).await;
        assert!(ended.is_err(), "the frozen session was ended");
    }

    /// Heartbeats have connections of their own: with every request
    /// connection held, the node is still noted live.
    #[tokio::test(flavor = "multi_thread")]
    async fn heartbeats_do_not_wait_behind_requests() {
        let url = pg::fresh_test_database().await;
        let c = PostgresCatalog::connect(&url).await.unwrap();
        let mut held = Vec::new();
        for _ in 0..POOL_SIZE {
            held.push(c.pool.get().await.unwrap());
        }
        assert_eq!(c.pool.status().available, 0, "every request connection is held");
        c.node_seen("a").await.unwrap();
        assert_eq!(c.live_nodes(Duration::from_secs(20)).await.unwrap(), ["a"]);
    }

    /// A node starting beside a current schema changes no table, so a long
    /// transaction elsewhere does not hold its start up, nor everyone's
    /// requests behind its lock; a schema that needs changing waits for
    /// its locks a bounded time, and says why it failed.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_current_schema_is_left_alone() {
        let url = pg::fresh_test_database().await;
        PostgresCatalog::connect(&url).await.unwrap();
        let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let reading = client.transaction().await.unwrap();
        reading.query("SELECT * FROM depot_catalog_buckets", &[]).await.unwrap();
        let started = tokio::time::timeout(Duration::from_secs(10), PostgresCatalog::connect(&url)).await;
        assert!(matches!(started, Ok(Ok(_))), "a start waited behind a reader");
        // An older schema, the reader still there: the change gives up.
        let (other, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        other.execute("DELETE FROM depot_catalog_settings WHERE name = 'schema'", &[]).await.unwrap();
        let refused = tokio::time::timeout(Duration::from_secs(60), PostgresCatalog::connect(&url)).await;
        let Ok(Err(CatalogError::Unavailable(m))) = refused else { panic!("{:?}", refused.map(|r| r.err())) };
        assert!(m.contains("lock timeout") && m.contains("schema up to date"), "{m}");
        // Once it has gone, the schema is brought up to date and noted.
        reading.commit().await.unwrap();
        PostgresCatalog::connect(&url).await.unwrap();
        let noted = other.query_one("SELECT value FROM depot_catalog_settings WHERE name = 'schema'", &[]).await;
        assert_eq!(noted.unwrap().get::<_, String>(0), schema_version());
    }
}
