//! Conditional requests (RFC 9110 section 13), evaluated in the order the
//! RFC gives, in one place for every route that serves or replaces objects.

use std::time::SystemTime;

use http::{HeaderMap, Method, header};

use crate::catalog::{ObjectRecord, Precondition, from_millis};

/// The outcome of a request's preconditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Proceed,
    /// 304 Not Modified (GET and HEAD only).
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// The validators of the current representation, if there is one.
#[derive(Clone, Copy, Debug)]
pub struct Validators<'a> {
    /// The entity tag without quotes.
    pub etag: &'a str,
    /// None when the answer gives no Last-Modified: date conditions are
    /// then ignored (RFC 9110 sections 13.1.3 and 13.1.4).
    pub modified: Option<SystemTime>,
}

impl<'a> Validators<'a> {
    /// An object's: a modification time of 0 is not given as Last-Modified.
    pub fn of(record: &'a ObjectRecord) -> Validators<'a> {
        let modified = record.shown_modified();
        Validators { etag: &record.etag, modified: (modified > 0).then(|| from_millis(modified)) }
    }
}

/// The tags of an `If-Match`/`If-None-Match` list, each with whether it
/// is weak (quotes and the `W/` prefix removed; `*` kept as is). A tag
/// sent without its quotes counts as the quoted one, as S3 and MinIO take
/// it: S3 clients pass on an ETag as their user typed it.
fn tags(value: &str) -> impl Iterator<Item = (bool, String)> + '_ {
    value.split(',').map(str::trim).filter(|t| !t.is_empty()).filter_map(|t| {
        let (weak, tag) = t.strip_prefix("W/").map_or((false, t), |w| (true, w));
        match tag {
            "*" => Some((weak, tag.to_string())),
            // Quoted, `"*"` is an entity tag like any other (RFC 9110
            // section 8.8.3), one that no object has: left out.
            _ => Some(tag.trim_matches('"')).filter(|t| *t != "*").map(|t| (weak, t.to_string())),
        }
    })
}

/// Splits an `If-None-Match` list into tags, compared weakly: weak tags
/// count as their strong twins.
pub fn etag_list(value: &str) -> Vec<String> {
    tags(value).map(|(_, t)| t).collect()
}

/// The tags of an `If-Match` list, compared strongly (RFC 9110 section
/// 13.1.1): a weak tag never matches, so it is left out.
pub fn strong_etags(value: &str) -> Vec<String> {
    tags(value).filter(|(weak, _)| !weak).map(|(_, t)| t).collect()
}

/// The conditions of a request that writes or deletes an object, for the
/// catalog to check inside its transaction.
pub fn write_precondition(headers: &HeaderMap) -> Precondition {
    let if_none_match = list(headers, &header::IF_NONE_MATCH).map(|v| etag_list(&v)).unwrap_or_default();
    Precondition {
        if_absent: if_none_match.iter().any(|t| t == "*"),
        if_match: list(headers, &header::IF_MATCH).map(|v| strong_etags(&v)),
        if_none_match: if_none_match.into_iter().filter(|t| t != "*").collect(),
        if_unmodified_since: date(headers, &header::IF_UNMODIFIED_SINCE).map(|t| secs(t) * 1000),
    }
}

/// A list header's every line as one list (RFC 9110 section 5.3): a
/// second `If-None-Match: *` line is as binding as the first. `None`
/// when the header is absent; lines that are not text are left out.
fn list(headers: &HeaderMap, name: &header::HeaderName) -> Option<String> {
    let mut lines = headers.get_all(name).iter().peekable();
    lines.peek()?;
    Some(lines.filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(","))
}

/// A date condition's value; `None` when it is absent, not a date, or
/// given in more than one line, which RFC 9110 (sections 13.1.3 and
/// 13.1.4) says to ignore rather than pick one of.
fn date(headers: &HeaderMap, name: &header::HeaderName) -> Option<SystemTime> {
    let mut lines = headers.get_all(name).iter();
    match (lines.next(), lines.next()) {
        (Some(v), None) => v.to_str().ok().and_then(|v| httpdate::parse_http_date(v).ok()),
        _ => None,
    }
}

/// HTTP dates have whole seconds; compare at that precision.
fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Evaluates If-Match, If-Unmodified-Since, If-None-Match and
/// If-Modified-Since against `current` (`None`: no representation).
pub fn evaluate(method: &Method, headers: &HeaderMap, current: Option<Validators<'_>>) -> Verdict {
    let read = method == Method::GET || method == Method::HEAD;
    if let Some(v) = list(headers, &header::IF_MATCH) {
        let tags = strong_etags(&v);
        let ok = current.is_some_and(|c| tags.iter().any(|t| t == "*" || t == c.etag));
        if !ok {
            return Verdict::Failed;
        }
    } else if let (Some(since), Some(modified)) =
        (date(headers, &header::IF_UNMODIFIED_SINCE), current.and_then(|c| c.modified))
        && secs(modified) > secs(since)
    {
        return Verdict::Failed;
    }
    if let Some(v) = list(headers, &header::IF_NONE_MATCH) {
        let tags = etag_list(&v);
        let matched = current.is_some_and(|c| tags.iter().any(|t| t == "*" || t == c.etag));
        if matched {
            return if read { Verdict::NotModified } else { Verdict::Failed };
        }
    } else if let (true, Some(since), Some(modified)) =
        (read, date(headers, &header::IF_MODIFIED_SINCE), current.and_then(|c| c.modified))
        && secs(modified) <= secs(since)
    {
        return Verdict::NotModified;
    }
    Verdict::Proceed
}

/// Whether a Range request may be served partially: true without
/// `If-Range`, or when it holds the object's strong ETag. A date never
/// holds: two versions can share a second (and a client can set an
/// object's time), so a date is a weak validator, which RFC 9110 does not
/// let a range be served by; the whole object is answered instead.
/// An `If-Range` that cannot be read (not text, or given twice) holds
/// nothing either.
pub fn if_range_holds(headers: &HeaderMap, current: Validators<'_>) -> bool {
    let mut given = headers.get_all(header::IF_RANGE).iter();
    let (v, None) = (given.next(), given.next()) else { return false };
    let Some(v) = v else { return true };
    let Ok(v) = v.to_str() else { return false };
    let v = v.trim();
    v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) == Some(current.etag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    const NOW: u64 = 1_700_000_000;

    fn cur() -> Option<Validators<'static>> {
        Some(Validators { etag: "abc", modified: Some(at(NOW)) })
    }

    #[test]
    fn if_none_match_gives_304_on_reads_and_412_on_writes() {
        let h = headers(&[("if-none-match", "\"x\", \"abc\"")]);
        assert_eq!(evaluate(&Method::GET, &h, cur()), Verdict::NotModified);
        assert_eq!(evaluate(&Method::HEAD, &h, cur()), Verdict::NotModified);
        assert_eq!(evaluate(&Method::PUT, &h, cur()), Verdict::Failed);
        let star = headers(&[("if-none-match", "*")]);
        assert_eq!(evaluate(&Method::PUT, &star, cur()), Verdict::Failed);
        assert_eq!(evaluate(&Method::PUT, &star, None), Verdict::Proceed);
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-none-match", "\"zzz\"")]), cur()), Verdict::Proceed);
    }

    #[test]
    fn a_quoted_star_is_a_tag_not_any() {
        let none_match = headers(&[("if-none-match", "\"*\"")]);
        assert_eq!(evaluate(&Method::GET, &none_match, cur()), Verdict::Proceed);
        assert_eq!(evaluate(&Method::PUT, &none_match, cur()), Verdict::Proceed);
        assert!(!write_precondition(&none_match).if_absent);
        let if_match = headers(&[("if-match", "\"*\"")]);
        assert_eq!(evaluate(&Method::PUT, &if_match, cur()), Verdict::Failed);
        assert_eq!(write_precondition(&if_match).if_match, Some(Vec::new()));
    }

    #[test]
    fn if_match_fails_on_mismatch_or_absence() {
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-match", "\"nope\"")]), cur()), Verdict::Failed);
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-match", "\"abc\"")]), cur()), Verdict::Proceed);
        assert_eq!(evaluate(&Method::PUT, &headers(&[("if-match", "*")]), None), Verdict::Failed);
    }

    #[test]
    fn dates_compare_in_whole_seconds() {
        let same = httpdate::fmt_http_date(at(NOW));
        let earlier = httpdate::fmt_http_date(at(NOW - 10));
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-modified-since", &same)]), cur()), Verdict::NotModified);
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-modified-since", &earlier)]), cur()), Verdict::Proceed);
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-unmodified-since", &earlier)]), cur()), Verdict::Failed);
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-modified-since", "garbage")]), cur()), Verdict::Proceed);
        // If-None-Match takes precedence over If-Modified-Since.
        let h = headers(&[("if-none-match", "\"zzz\""), ("if-modified-since", &same)]);
        assert_eq!(evaluate(&Method::GET, &h, cur()), Verdict::Proceed);
        // Two lines of a date are ignored, not read as the first.
        let twice = headers(&[("if-modified-since", &same), ("if-modified-since", &earlier)]);
        assert_eq!(evaluate(&Method::GET, &twice, cur()), Verdict::Proceed);
        let twice = headers(&[("if-unmodified-since", &earlier), ("if-unmodified-since", &same)]);
        assert_eq!(evaluate(&Method::GET, &twice, cur()), Verdict::Proceed);
    }

    #[test]
    fn dates_are_ignored_without_a_modification_time() {
        let undated = Validators { etag: "abc", modified: None };
        let date = httpdate::fmt_http_date(at(1));
        let modified_since = headers(&[("if-modified-since", &date)]);
        assert_eq!(evaluate(&Method::GET, &modified_since, Some(undated)), Verdict::Proceed);
        let unmodified_since = headers(&[("if-unmodified-since", &date)]);
        assert_eq!(evaluate(&Method::GET, &unmodified_since, Some(undated)), Verdict::Proceed);
        assert!(!if_range_holds(&headers(&[("if-range", &date)]), undated));
    }

    #[test]
    fn if_match_compares_strongly() {
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-match", "W/\"abc\"")]), cur()), Verdict::Failed);
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-match", "W/\"x\", \"abc\"")]), cur()), Verdict::Proceed);
        // If-None-Match compares weakly.
        assert_eq!(evaluate(&Method::GET, &headers(&[("if-none-match", "W/\"abc\"")]), cur()), Verdict::NotModified);
    }

    #[test]
    fn writes_check_every_condition_in_the_catalog() {
        let record = ObjectRecord {
            key: "k".into(),
            size: 0,
            parts: Vec::new(),
            etag: "abc".into(),
            sha256: crate::engine::Digest([0; 32]),
            content_type: String::new(),
            modified: NOW * 1000 + 500,
            metadata: Vec::new(),
            headers: Vec::new(),
            body: None,
        };
        let holds = |pairs: &[(&str, &str)]| write_precondition(&headers(pairs)).check(Some(&record));
        assert!(!holds(&[("if-none-match", "\"abc\"")]));
        assert!(holds(&[("if-none-match", "\"zzz\"")]));
        assert!(!holds(&[("if-none-match", "*")]));
        assert!(!holds(&[("if-match", "W/\"abc\"")]));
        assert!(holds(&[("if-match", "\"abc\"")]));
        assert!(!holds(&[("if-unmodified-since", &httpdate::fmt_http_date(at(NOW - 1)))]));
        assert!(holds(&[("if-unmodified-since", &httpdate::fmt_http_date(at(NOW)))]));
        // If-Match, when given, decides instead of If-Unmodified-Since.
        assert!(holds(&[("if-match", "\"abc\""), ("if-unmodified-since", &httpdate::fmt_http_date(at(NOW - 1)))]));
        assert!(write_precondition(&headers(&[("if-none-match", "\"abc\"")])).check(None));
    }

    #[test]
    fn if_range_needs_a_strong_match() {
        let c = cur().unwrap();
        assert!(if_range_holds(&headers(&[]), c));
        assert!(if_range_holds(&headers(&[("if-range", "\"abc\"")]), c));
        assert!(!if_range_holds(&headers(&[("if-range", "\"old\"")]), c));
        for half in ["\"abc", "abc\"", "abc", "\"\"abc\"\""] {
            assert!(!if_range_holds(&headers(&[("if-range", half)]), c), "not an entity tag: {half}");
        }
        assert!(!if_range_holds(&headers(&[("if-range", "\"abc\""), ("if-range", "\"abc\"")]), c), "twice");
        let mut unreadable = HeaderMap::new();
        unreadable.insert(header::IF_RANGE, http::HeaderValue::from_bytes(b"\"\xe4abc\"").unwrap());
        assert!(!if_range_holds(&unreadable, c), "not text");
        assert!(!if_range_holds(&headers(&[("if-range", "W/\"abc\"")]), c));
        assert!(!if_range_holds(&headers(&[("if-range", &httpdate::fmt_http_date(at(NOW)))]), c), "a date is weak");
        assert!(!if_range_holds(&headers(&[("if-range", &httpdate::fmt_http_date(at(NOW - 1)))]), c));
    }
}
