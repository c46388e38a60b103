//! The conformance suite every [`Catalog`] runs: plain async functions
//! taking `&dyn Catalog`. Each asserts one promise of the trait.

use std::time::Duration;

use super::{
    BucketRecord, Catalog, CatalogError, CatalogExt, ListQuery, ObjectPut, ObjectRecord, Part, Precondition, now_millis,
};
use crate::engine::{BlobRef, Digest};

pub(super) fn bucket(name: &str) -> BucketRecord {
    BucketRecord::new(name, "", false)
}

pub(super) fn digest(n: u8) -> Digest {
    Digest([n; 32])
}

pub(super) fn blob(n: u8, size: u64) -> BlobRef {
    BlobRef { digest: digest(n), size, locator: vec![n] }
}

/// A record of `blobs`; a small one-part record carries its body, so that
/// every check below also sees bodies kept and read back.
fn record(key: &str, blobs: &[BlobRef]) -> ObjectRecord {
    let body = match blobs {
        [only] if only.size <= super::BODY_IN_RECORD => {
            Some(bytes::Bytes::from(vec![only.digest.0[0]; only.size as usize]))
        }
        _ => None,
    };
    ObjectRecord {
        key: key.to_string(),
        size: blobs.iter().map(|b| b.size).sum(),
        parts: blobs.iter().map(|b| Part { digest: b.digest, size: b.size }).collect(),
        etag: format!("etag-{key}"),
        sha256: digest(0),
        content_type: "text/plain".into(),
        modified: now_millis(),
        metadata: vec![("a".into(), "b".into())],
        headers: vec![("cache-control".into(), format!("max-age={}", key.len()))],
        body,
    }
}

pub(super) fn put(bucket: &str, key: &str, blobs: &[BlobRef]) -> ObjectPut {
    ObjectPut {
        bucket: bucket.into(),
        record: record(key, blobs),
        blobs: blobs.to_vec(),
        precondition: Precondition::default(),
    }
}

/// Runs the whole suite on an empty catalog.
pub async fn run_all(catalog: &dyn Catalog) {
    buckets(catalog).await;
    objects_and_references(catalog).await;
    preconditions(catalog).await;
    batches_are_all_or_nothing(catalog).await;
    writes_that_change_no_count_report_what_they_stored(catalog).await;
    listing(catalog).await;
    dead_blobs_wait_for_grace(catalog).await;
    concurrent_same_content(catalog).await;
    blobs_are_listed_and_moved(catalog).await;
    repairs_set_counts_and_totals(catalog).await;
}

pub async fn buckets(c: &dyn Catalog) {
    c.create_bucket(&BucketRecord::new("alpha", "ak", false)).await.unwrap();
    assert!(matches!(c.create_bucket(&bucket("alpha")).await, Err(CatalogError::BucketExists(_))));
    let alpha = c.bucket("alpha").await.unwrap().unwrap();
    assert_eq!((alpha.name.as_str(), alpha.owner.as_str(), alpha.public_read), ("alpha", "ak", false));
    c.set_bucket_public("alpha", true).await.unwrap();
    assert!(c.bucket("alpha").await.unwrap().is_some_and(|b| b.public_read && b.owner == "ak"));
    assert!(c.buckets().await.unwrap().iter().any(|b| b.name == "alpha" && b.public_read));
    assert!(matches!(c.set_bucket_public("beta", true).await, Err(CatalogError::NoSuchBucket(_))));
    assert!(c.bucket("beta").await.unwrap().is_none());
    c.put_object(put("alpha", "k", &[blob(1, 10)])).await.unwrap();
    assert!(matches!(c.delete_bucket("alpha").await, Err(CatalogError::BucketNotEmpty(_))));
    c.delete_object("alpha", "k", &Precondition::default()).await.unwrap();
    c.delete_bucket("alpha").await.unwrap();
    assert!(matches!(c.delete_bucket("alpha").await, Err(CatalogError::NoSuchBucket(_))));
    assert!(matches!(c.put_object(put("alpha", "k", &[blob(1, 10)])).await, Err(CatalogError::NoSuchBucket(_))));
    assert!(!c.buckets().await.unwrap().iter().any(|b| b.name == "alpha"));
}

pub async fn objects_and_references(c: &dyn Catalog) {
    c.create_bucket(&bucket("refs")).await.unwrap();
    let before = c.stats().await.unwrap();
    let first = c.put_object(put("refs", "a", &[blob(10, 100)])).await.unwrap();
    assert!(!first.deduplicated && first.replaced.is_none());
    let second = c.put_object(put("refs", "b", &[blob(10, 100)])).await.unwrap();
    assert!(second.deduplicated, "same blob under a second key is a dedup hit");
    assert_eq!(c.get_blob(&digest(10)).await.unwrap().unwrap().refs, 2);
    let got = c.get_object("refs", "a").await.unwrap().unwrap();
    assert_eq!(got, record("a", &[blob(10, 100)]).clone_with_time(got.modified));
    // Overwrite "a" with other content: blob 10 loses a reference.
    let over = c.put_object(put("refs", "a", &[blob(11, 5), blob(11, 5)])).await.unwrap();
    assert_eq!(over.replaced.map(|r| r.key), Some("a".to_string()));
    assert_eq!(c.get_blob(&digest(10)).await.unwrap().unwrap().refs, 1);
    assert_eq!(c.get_blob(&digest(11)).await.unwrap().unwrap().refs, 2, "a blob twice in one object counts twice");
    c.delete_object("refs", "b", &Precondition::default()).await.unwrap();
    let dead = c.get_blob(&digest(10)).await.unwrap().unwrap();
    assert_eq!(dead.refs, 0);
    assert!(dead.unreferenced_since.is_some());
    assert!(c.delete_object("refs", "b", &Precondition::default()).await.unwrap().is_none());
    let after = c.stats().await.unwrap();
    assert_eq!(after.objects - before.objects, 1);
    assert_eq!(after.logical_bytes - before.logical_bytes, 10);
    assert_eq!(after.blobs - before.blobs, 2);
    assert_eq!(after.blob_bytes - before.blob_bytes, 105);
    // A blob already stored under another locator is reported redundant.
    let other = BlobRef { locator: vec![99], ..blob(11, 5) };
    let out = c.put_object(put("refs", "c", std::slice::from_ref(&other))).await.unwrap();
    assert_eq!(out.redundant, vec![other]);
    let multi = c.get_objects("refs", &["a".into(), "zz".into(), "c".into()]).await.unwrap();
    assert_eq!(
        multi.iter().map(|o| o.as_ref().map(|o| o.key.as_str())).collect::<Vec<_>>(),
        [Some("a"), None, Some("c")]
    );
    // The store's own buckets hold records, not objects: their blobs count,
    // they do not.
    c.create_bucket(&bucket("_own")).await.unwrap();
    let before = c.stats().await.unwrap();
    c.put_object(put("_own", "p/1", &[blob(12, 7)])).await.unwrap();
    let during = c.stats().await.unwrap();
    assert_eq!((during.objects, during.logical_bytes), (before.objects, before.logical_bytes));
    assert_eq!((during.blobs - before.blobs, during.blob_bytes - before.blob_bytes), (1, 7));
    c.delete_object("_own", "p/1", &Precondition::default()).await.unwrap();
    let after = c.stats().await.unwrap();
    assert_eq!((after.objects, after.logical_bytes), (before.objects, before.logical_bytes));
    c.delete_bucket("_own").await.unwrap();
}

impl ObjectRecord {
    fn clone_with_time(&self, modified: u64) -> ObjectRecord {
        ObjectRecord { modified, ..self.clone() }
    }
}

pub async fn preconditions(c: &dyn Catalog) {
    c.create_bucket(&bucket("cond")).await.unwrap();
    let absent = Precondition { if_absent: true, ..Default::default() };
    c.put_object(ObjectPut { precondition: absent.clone(), ..put("cond", "k", &[blob(20, 1)]) }).await.unwrap();
    let again = c.put_object(ObjectPut { precondition: absent, ..put("cond", "k", &[blob(21, 1)]) }).await;
    assert!(matches!(again, Err(CatalogError::PreconditionFailed)));
    assert!(c.get_blob(&digest(21)).await.unwrap().is_none(), "a failed put leaves no reference");
    let wrong = Precondition { if_match: Some(vec!["nope".into()]), ..Default::default() };
    let r = c.put_object(ObjectPut { precondition: wrong.clone(), ..put("cond", "k", &[blob(21, 1)]) }).await;
    assert!(matches!(r, Err(CatalogError::PreconditionFailed)));
    assert!(matches!(c.delete_object("cond", "k", &wrong).await, Err(CatalogError::PreconditionFailed)));
    let right = Precondition { if_match: Some(vec!["etag-k".into()]), ..Default::default() };
    c.put_object(ObjectPut { precondition: right, ..put("cond", "k", &[blob(21, 1)]) }).await.unwrap();
    assert_eq!(c.get_object("cond", "k").await.unwrap().unwrap().parts[0].digest, digest(21));
}

pub async fn batches_are_all_or_nothing(c: &dyn Catalog) {
    c.create_bucket(&bucket("batch")).await.unwrap();
    c.put_object(put("batch", "exists", &[blob(30, 1)])).await.unwrap();
    let mut failing = put("batch", "exists", &[blob(31, 1)]);
    failing.precondition.if_absent = true;
    let r = c.put_objects(vec![put("batch", "new", &[blob(32, 1)]), failing]).await;
    assert!(matches!(r, Err(CatalogError::PreconditionFailed)));
    assert!(c.get_object("batch", "new").await.unwrap().is_none(), "no part of a failed batch is kept");
    let ok = c.put_objects(vec![put("batch", "x", &[blob(33, 1)]), put("batch", "y", &[blob(33, 1)])]).await.unwrap();
    assert_eq!(ok.len(), 2);
    assert!(!ok[0].deduplicated && ok[1].deduplicated, "dedup holds inside one batch");
    let gone =
        c.delete_objects("batch", &["x".into(), "nope".into(), "y".into()], &Precondition::default()).await.unwrap();
    assert_eq!(gone.iter().map(Option::is_some).collect::<Vec<_>>(), [true, false, true]);
    assert_eq!(c.get_blob(&digest(33)).await.unwrap().unwrap().refs, 0);
}

/// A write whose references to a digest net out to no change still answers
/// for the bytes it stored: as redundant when the catalog has them elsewhere,
/// as a dead blob when the same batch stored and released them.
pub async fn writes_that_change_no_count_report_what_they_stored(c: &dyn Catalog) {
    c.create_bucket(&bucket("net")).await.unwrap();
    c.put_object(put("net", "k", &[blob(40, 3)])).await.unwrap();
    let elsewhere = BlobRef { locator: vec![98], ..blob(40, 3) };
    let again = c.put_object(put("net", "k", std::slice::from_ref(&elsewhere))).await.unwrap();
    assert_eq!(again.redundant, vec![elsewhere]);
    assert!(again.deduplicated);
    let kept = c.get_blob(&digest(40)).await.unwrap().unwrap();
    assert_eq!((kept.refs, kept.locator.as_slice()), (1, &[40u8][..]));
    // Within one batch too: the second copy of a content is redundant.
    let second = BlobRef { locator: vec![97], ..blob(43, 1) };
    let both = c.put_objects(vec![put("net", "x", &[blob(43, 1)]), put("net", "y", std::slice::from_ref(&second))]);
    let both = both.await.unwrap();
    assert_eq!((both[0].deduplicated, both[0].redundant.as_slice()), (false, &[][..]));
    assert_eq!((both[1].deduplicated, both[1].redundant.as_slice()), (true, std::slice::from_ref(&second)));
    let kept = c.get_blob(&digest(43)).await.unwrap().unwrap();
    assert_eq!((kept.refs, kept.locator.as_slice()), (2, &[43u8][..]));
    let before = c.stats().await.unwrap();
    let twice = c.put_objects(vec![put("net", "twice", &[blob(41, 2)]), put("net", "twice", &[blob(42, 4)])]).await;
    let twice = twice.unwrap();
    assert!(!twice[0].deduplicated && !twice[1].deduplicated);
    let released = c.get_blob(&digest(41)).await.unwrap().expect("bytes the batch stored are recorded");
    assert_eq!(released.refs, 0);
    assert!(released.unreferenced_since.is_some());
    assert!(c.dead_blobs(Duration::ZERO, 1000).await.unwrap().iter().any(|b| b.digest == digest(41)));
    assert_eq!(c.get_blob(&digest(42)).await.unwrap().unwrap().refs, 1);
    let after = c.stats().await.unwrap();
    assert_eq!((after.objects - before.objects, after.logical_bytes - before.logical_bytes), (1, 4));
    assert_eq!((after.blobs - before.blobs, after.blob_bytes - before.blob_bytes), (2, 6));
}

/// The keys and common prefixes of `bucket`, page by page from `query`,
/// following each page's `next`.
async fn every_page(c: &dyn Catalog, bucket: &str, mut query: ListQuery) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let page = c.list_objects(bucket, &query).await.unwrap();
        seen.extend(page.objects.iter().map(|o| o.key.clone()));
        seen.extend(page.prefixes);
        match page.next {
            Some(n) => query.after = Some(n),
            None => return seen,
        }
    }
}

pub async fn listing(c: &dyn Catalog) {
    c.create_bucket(&bucket("list")).await.unwrap();
    c.create_bucket(&bucket("list2")).await.unwrap();
    let keys = ["a/1", "a/2", "a/b/3", "b", "c/4", "c0", "d"];
    for k in keys {
        c.put_object(put("list", k, &[blob(40, 1)])).await.unwrap();
    }
    c.put_object(put("list2", "a/1", &[blob(40, 1)])).await.unwrap();
    let all = c.list_objects("list", &ListQuery { limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(all.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), keys);
    assert_eq!(all.next, None);
    let dirs = c
        .list_objects("list", &ListQuery { delimiter: Some("/".into()), limit: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(dirs.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["b", "c0", "d"]);
    assert_eq!(dirs.prefixes, ["a/", "c/"]);
    let under = ListQuery { prefix: "a/".into(), delimiter: Some("/".into()), limit: 100, ..Default::default() };
    let under = c.list_objects("list", &under).await.unwrap();
    assert_eq!(under.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["a/1", "a/2"]);
    assert_eq!(under.prefixes, ["a/b/"]);
    // Paging with a delimiter: a page may end on a common prefix.
    let mut seen =
        every_page(c, "list", ListQuery { delimiter: Some("/".into()), limit: 2, ..Default::default() }).await;
    seen.sort();
    assert_eq!(seen, ["a/", "b", "c/", "c0", "d"]);
    // A folder marker equal to the prefix, then paged one entry at a time:
    // the keys after the marker are still listed.
    c.put_object(put("list", "a/", &[blob(40, 1)])).await.unwrap();
    let one_by_one = ListQuery { prefix: "a/".into(), delimiter: Some("/".into()), limit: 1, ..Default::default() };
    assert_eq!(every_page(c, "list", one_by_one).await, ["a/", "a/1", "a/2", "a/b/"]);
    // A delimiter of several characters, as S3 allows, paged too.
    for k in ["x.json", "x.jsonl", "y/z.json.gz", "z"] {
        c.put_object(put("list2", k, &[blob(40, 1)])).await.unwrap();
    }
    let json = ListQuery { delimiter: Some(".json".into()), limit: 1, ..Default::default() };
    assert_eq!(every_page(c, "list2", json.clone()).await, ["a/1", "x.json", "y/z.json", "z"]);
    let page = c.list_objects("list2", &ListQuery { limit: 10, ..json }).await.unwrap();
    assert_eq!(page.prefixes, ["x.json", "y/z.json"], "x.jsonl rolls up to x.json");
    // Keys that go on past the greatest character: a common prefix is
    // still listed once, and what follows it still comes.
    c.create_bucket(&bucket("list3")).await.unwrap();
    for k in ["a/\u{10FFFF}x", "a/\u{10FFFF}\u{10FFFF}", "b", "\u{10FFFF}/c", "\u{10FFFF}\u{10FFFF}"] {
        c.put_object(put("list3", k, &[blob(40, 1)])).await.unwrap();
    }
    let slash = ListQuery { delimiter: Some("/".into()), limit: 10, ..Default::default() };
    let page = c.list_objects("list3", &slash).await.unwrap();
    assert_eq!(page.prefixes, ["a/", "\u{10FFFF}/"]);
    assert_eq!(page.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["b", "\u{10FFFF}\u{10FFFF}"]);
    assert_eq!(page.next, None);
    let paged = every_page(c, "list3", ListQuery { limit: 1, ..slash }).await;
    assert_eq!(paged, ["a/", "b", "\u{10FFFF}/", "\u{10FFFF}\u{10FFFF}"]);
    let missing = c.list_objects("nope", &ListQuery { limit: 10, ..Default::default() }).await;
    assert!(matches!(missing, Err(CatalogError::NoSuchBucket(_))));
}

pub async fn dead_blobs_wait_for_grace(c: &dyn Catalog) {
    c.create_bucket(&bucket("gc")).await.unwrap();
    c.put_object(put("gc", "k", &[blob(50, 7)])).await.unwrap();
    c.delete_object("gc", "k", &Precondition::default()).await.unwrap();
    assert!(c.get_blob(&digest(50)).await.unwrap().unwrap().unreferenced_since.is_some());
    let hour = Duration::from_secs(3600);
    let early = c.dead_blobs(hour, 100).await.unwrap();
    assert!(!early.iter().any(|b| b.digest == digest(50)), "not dead before its grace");
    assert!(!c.remove_dead_blob(&digest(50), Some(hour)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(30)).await;
    let due = c.dead_blobs(Duration::from_millis(10), 100).await.unwrap();
    assert!(due.iter().any(|b| b.digest == digest(50)));
    // A new reference revives it.
    c.put_object(put("gc", "k2", &[blob(50, 7)])).await.unwrap();
    assert!(!c.dead_blobs(Duration::ZERO, 100).await.unwrap().iter().any(|b| b.digest == digest(50)));
    assert!(!c.remove_dead_blob(&digest(50), None).await.unwrap());
    c.delete_object("gc", "k2", &Precondition::default()).await.unwrap();
    let before = c.stats().await.unwrap();
    assert!(c.remove_dead_blob(&digest(50), None).await.unwrap());
    assert!(c.get_blob(&digest(50)).await.unwrap().is_none());
    assert_eq!(c.stats().await.unwrap().blobs, before.blobs - 1);
}

pub async fn concurrent_same_content(c: &dyn Catalog) {
    c.create_bucket(&bucket("race")).await.unwrap();
    let puts = (0..20).map(|i| c.put_object(put("race", &format!("k{i}"), &[blob(60, 3)])));
    let outcomes = futures::future::join_all(puts).await;
    let fresh = outcomes.iter().filter(|o| !o.as_ref().unwrap().deduplicated).count();
    assert_eq!(fresh, 1, "exactly one put stores the blob");
    assert_eq!(c.get_blob(&digest(60)).await.unwrap().unwrap().refs, 20);
}

pub async fn blobs_are_listed_and_moved(c: &dyn Catalog) {
    c.create_bucket(&bucket("move")).await.unwrap();
    c.put_object(put("move", "a", &[blob(200, 1), blob(201, 2), blob(202, 3)])).await.unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = c.list_blobs(after, 2).await.unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = Some(last.digest);
        seen.extend(page.iter().map(|b| b.digest));
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "blobs come in digest order, each once");
    for n in 200..=202 {
        assert!(seen.contains(&digest(n)), "blob {n} listed");
    }
    c.set_locators(&[(digest(201), b"moved".to_vec()), (digest(203), b"absent".to_vec())]).await.unwrap();
    let blobs = c.get_blobs(&[digest(200), digest(201), digest(203)]).await.unwrap();
    assert_eq!(blobs[0].as_ref().unwrap().locator, vec![200]);
    let moved = blobs[1].as_ref().unwrap();
    assert_eq!((moved.locator.as_slice(), moved.refs, moved.size), (&b"moved"[..], 1, 2));
    assert!(blobs[2].is_none(), "setting a locator creates no record");
}

pub async fn repairs_set_counts_and_totals(c: &dyn Catalog) {
    c.create_bucket(&bucket("repair")).await.unwrap();
    c.put_object(put("repair", "a", &[blob(210, 4), blob(211, 5)])).await.unwrap();
    c.set_refs(&[(digest(210), 3), (digest(211), 0), (digest(212), 9)]).await.unwrap();
    let blobs = c.get_blobs(&[digest(210), digest(211), digest(212)]).await.unwrap();
    let (raised, zeroed) = (blobs[0].as_ref().unwrap(), blobs[1].as_ref().unwrap());
    assert_eq!((raised.refs, raised.unreferenced_since), (3, None));
    assert_eq!(zeroed.refs, 0);
    assert!(zeroed.unreferenced_since.is_some(), "a count set to zero starts the grace period");
    assert!(c.dead_blobs(Duration::ZERO, 1000).await.unwrap().iter().any(|b| b.digest == digest(211)));
    assert!(blobs[2].is_none(), "setting a count creates no record");
    c.set_refs(&[(digest(211), 1)]).await.unwrap();
    assert!(!c.dead_blobs(Duration::ZERO, 1000).await.unwrap().iter().any(|b| b.digest == digest(211)));

    let totals = super::CatalogStats { objects: 7, logical_bytes: 70, blobs: 3, blob_bytes: 30 };
    c.set_stats(totals).await.unwrap();
    assert_eq!(c.stats().await.unwrap(), totals);
    c.put_object(put("repair", "b", &[blob(213, 6)])).await.unwrap();
    let after = c.stats().await.unwrap();
    assert_eq!((after.objects, after.blobs, after.blob_bytes), (8, 4, 36), "totals go on from the set values");
}
