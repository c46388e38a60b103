//! Request paths to endpoints: percent-decoding, then bucket and key
//! rules. A decoded name, encoded again, parses back to itself; no name
//! of the store's own buckets passes the bucket rules.
#![no_main]

use depot::http::fuzzing::Endpoint;
use depot::store::names;
use libfuzzer_sys::fuzz_target;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else { return };
    let Ok(endpoint) = Endpoint::parse(path) else { return };
    let (bucket, key) = match &endpoint {
        Endpoint::Bucket(b) => (b, None),
        Endpoint::Object { bucket, key } => (bucket, Some(key)),
        _ => return,
    };
    // The store's own buckets (`_uploads`, ...) are out of every client's
    // reach, however their name is spelt in the path.
    assert!(!bucket.starts_with('_') || names::check_bucket(bucket).is_err(), "{path:?} reached {bucket:?}");
    let mut again = format!("/{}", utf8_percent_encode(bucket, NON_ALPHANUMERIC));
    if let Some(key) = key {
        let _ = names::check_key(key, names::MAX_KEY_BYTES);
        again.push('/');
        again.push_str(&utf8_percent_encode(key, NON_ALPHANUMERIC).to_string());
    }
    if bucket == "_" || (bucket.is_empty() && key.is_none()) {
        return; // internal routes and the root
    }
    assert_eq!(Endpoint::parse(&again).ok().as_ref(), Some(&endpoint), "{path:?} → {again:?}");
});
