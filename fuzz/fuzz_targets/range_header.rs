//! `Range` headers against any object length and range limit: the answer
//! stays inside the object, honours the limit, and never carries more
//! bytes than the object has (no CVE-2011-3192 amplification).
#![no_main]

use depot::http::range::{self, RangeAnswer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let len = u64::from_le_bytes(data[..8].try_into().unwrap()) >> (data[8] % 64);
    let max_ranges = usize::from(data[8] / 64) * 20 + 1;
    let Ok(value) = std::str::from_utf8(&data[9..]) else { return };
    let Some(specs) = range::parse(value) else { return };
    assert!(!specs.is_empty());
    match range::resolve(&specs, len, max_ranges) {
        // Past the limit, or a suffix of an empty object: all of it.
        RangeAnswer::Full => assert!(
            specs.len() > max_ranges
                || (len == 0 && specs.iter().any(|s| matches!(s, range::RangeSpec::Suffix(n) if *n > 0)))
        ),
        RangeAnswer::Unsatisfiable => {}
        RangeAnswer::Partial(ranges) => {
            assert!(!ranges.is_empty() && ranges.len() <= max_ranges);
            let mut total = 0u64;
            for r in &ranges {
                assert!(r.start < r.end && r.end <= len, "{r:?} outside 0..{len}");
                total += r.end - r.start;
            }
            assert!(total <= len, "{value:?}: {total} bytes of a {len}-byte object");
        }
    }
});
