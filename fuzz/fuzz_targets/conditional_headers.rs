//! If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since and
//! If-Range, as any client may send them: no panic, 304 only for reads.
#![no_main]

use std::time::{Duration, SystemTime};

use depot::http::conditional::{self, Validators, Verdict};
use depot::http::fuzzing::headers;
use http::Method;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let h = headers(data);
    let modified = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let current = Validators { etag: "abc", modified };
    let undated = Validators { etag: "abc", modified: None };
    for method in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
        let read = method == Method::GET || method == Method::HEAD;
        for validators in [Some(current), Some(undated), None] {
            let verdict = conditional::evaluate(&method, &h, validators);
            assert!(read || verdict != Verdict::NotModified, "{method} got 304");
        }
    }
    let _ = conditional::if_range_holds(&h, current);
    let _ = conditional::if_range_holds(&h, undated);
    // Writes: the same headers as the catalog checks them; with no object,
    // only If-Match can fail.
    let precondition = conditional::write_precondition(&h);
    assert!(precondition.check(None) || precondition.if_match.is_some(), "{precondition:?}");
    for value in h.values().filter_map(|v| v.to_str().ok()) {
        for tag in conditional::etag_list(value) {
            assert!(!tag.starts_with("W/") || tag.len() > 2 || tag == "W/");
        }
    }
});
