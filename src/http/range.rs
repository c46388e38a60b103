//! `Range` request headers (RFC 9110 section 14): parsing `bytes=` range
//! sets and resolving them against a representation's length.

use crate::engine::ByteRange;

/// One range as written by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeSpec {
    /// `a-b`: from `a` to `b` inclusive.
    Bounded(u64, u64),
    /// `a-`: from `a` to the end.
    From(u64),
    /// `-n`: the last `n` bytes.
    Suffix(u64),
}

/// What to do with a request's Range header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// No usable Range: send the whole representation (200).
    Full,
    /// Send these ranges (206); more than one means `multipart/byteranges`.
    Partial(Vec<ByteRange>),
    /// None of the ranges overlaps the representation (416).
    Unsatisfiable,
}

/// Parses a `Range` header value. Returns `None` when the header is not a
/// valid `bytes` range set, which RFC 9110 says to ignore.
pub fn parse(value: &str) -> Option<Vec<RangeSpec>> {
    let (unit, set) = value.trim().split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let mut specs = Vec::new();
    for part in set.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (first, last) = part.split_once('-')?;
        let (first, last) = (first.trim(), last.trim());
        let number = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Digits beyond u64 are a valid, very large number: saturate.
            Some(s.parse().unwrap_or(u64::MAX))
        };
        specs.push(match (first.is_empty(), last.is_empty()) {
            (true, true) => return None,
            (true, false) => RangeSpec::Suffix(number(last)?),
            (false, true) => RangeSpec::From(number(first)?),
            (false, false) => {
                let (a, b) = (number(first)?, number(last)?);
                if b < a {
                    return None;
                }
                RangeSpec::Bounded(a, b)
            }
        });
    }
    if specs.is_empty() { None } else { Some(specs) }
}

/// Resolves ranges against a length of `len` bytes. Against many-range
/// amplification (CVE-2011-3192): a request for more than `max_ranges`
/// gets the whole representation, and overlapping ranges are coalesced
/// (RFC 9110 section 14.2 allows both), so an answer never carries more
/// bytes of the object than it has.
pub fn resolve(specs: &[RangeSpec], len: u64, max_ranges: usize) -> RangeAnswer {
    if specs.len() > max_ranges {
        return RangeAnswer::Full;
    }
    let ranges: Vec<ByteRange> = specs
        .iter()
        .filter_map(|spec| {
            let (start, end) = match *spec {
                RangeSpec::Bounded(a, b) => (a, b.saturating_add(1).min(len)),
                RangeSpec::From(a) => (a, len),
                RangeSpec::Suffix(n) => (len.saturating_sub(n), len),
            };
            // A suffix of zero bytes and a start at or past the end both
            // select nothing.
            (start < end).then_some(ByteRange { start, end })
        })
        .collect();
    if ranges.is_empty() {
        // RFC 9110 section 14.1.1: of an empty representation, a suffix
        // of some bytes is satisfiable, and selects all of it: nothing.
        let suffix = specs.iter().any(|s| matches!(s, RangeSpec::Suffix(n) if *n > 0));
        return if len == 0 && suffix { RangeAnswer::Full } else { RangeAnswer::Unsatisfiable };
    }
    let mut sorted = ranges.clone();
    sorted.sort_unstable_by_key(|r| r.start);
    if sorted.windows(2).all(|w| w[0].end <= w[1].start) {
        return RangeAnswer::Partial(ranges);
    }
    // Overlaps: ascending order, each byte once.
    let mut merged: Vec<ByteRange> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    RangeAnswer::Partial(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(parse("bytes=0-499"), Some(vec![RangeSpec::Bounded(0, 499)]));
        assert_eq!(parse("bytes=500-"), Some(vec![RangeSpec::From(500)]));
        assert_eq!(parse("bytes=-500"), Some(vec![RangeSpec::Suffix(500)]));
        assert_eq!(
            parse("BYTES= 0-0 , -1,5-"),
            Some(vec![RangeSpec::Bounded(0, 0), RangeSpec::Suffix(1), RangeSpec::From(5)])
        );
        assert_eq!(parse("bytes=99999999999999999999999-"), Some(vec![RangeSpec::From(u64::MAX)]));
    }

    #[test]
    fn invalid_headers_are_ignored() {
        for bad in [
            "",
            "bytes",
            "bytes=",
            "bytes=-",
            "bytes=5-1",
            "bytes=a-b",
            "items=0-1",
            "bytes=1-2-3",
            "bytes=+1-2",
            "bytes=--1",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn resolves_against_length() {
        let len = 1000;
        let go = |v: &str| resolve(&parse(v).unwrap(), len, 10);
        assert_eq!(go("bytes=0-499"), RangeAnswer::Partial(vec![r(0, 500)]));
        assert_eq!(go("bytes=900-2000"), RangeAnswer::Partial(vec![r(900, 1000)]), "end is clamped");
        assert_eq!(go("bytes=-300"), RangeAnswer::Partial(vec![r(700, 1000)]));
        assert_eq!(go("bytes=-5000"), RangeAnswer::Partial(vec![r(0, 1000)]));
        assert_eq!(go("bytes=1000-"), RangeAnswer::Unsatisfiable);
        assert_eq!(go("bytes=-0"), RangeAnswer::Unsatisfiable);
        assert_eq!(go("bytes=2000-3000,0-0"), RangeAnswer::Partial(vec![r(0, 1)]), "unsatisfiable parts drop out");
        assert_eq!(resolve(&parse("bytes=0-").unwrap(), 0, 10), RangeAnswer::Unsatisfiable, "empty object");
        assert_eq!(resolve(&parse("bytes=-5").unwrap(), 0, 10), RangeAnswer::Full, "a suffix of an empty object");
        assert_eq!(resolve(&parse("bytes=-0").unwrap(), 0, 10), RangeAnswer::Unsatisfiable);
        let many: Vec<_> = (0..11).map(|i| RangeSpec::Bounded(i, i)).collect();
        assert_eq!(resolve(&many, len, 10), RangeAnswer::Full);
    }

    #[test]
    fn overlapping_ranges_are_coalesced_and_disjoint_ones_kept_in_order() {
        let len = 1000;
        let go = |v: &str| resolve(&parse(v).unwrap(), len, 100);
        assert_eq!(go("bytes=500-599,0-99"), RangeAnswer::Partial(vec![r(500, 600), r(0, 100)]));
        assert_eq!(go("bytes=0-,0-,0-"), RangeAnswer::Partial(vec![r(0, 1000)]));
        assert_eq!(go("bytes=50-150,0-99,-900,900-"), RangeAnswer::Partial(vec![r(0, 1000)]));
        assert_eq!(go("bytes=0-9,5-19,30-39"), RangeAnswer::Partial(vec![r(0, 20), r(30, 40)]));
        assert_eq!(
            go("bytes=0-9,10-19"),
            RangeAnswer::Partial(vec![r(0, 10), r(10, 20)]),
            "adjacent is not overlapping"
        );
    }
}
