//! Conditional requests (RFC 9110 section 13), evaluated in the order the
//! RFC gives, in one place for every route that serves or replaces objects.

use std::time::SystemTime;

use http::{HeaderMap, Method, header};

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
    pub modified: SystemTime,
}

/// Splits an `If-Match`/`If-None-Match` list into tags (quotes and weak
/// prefixes removed; `*` kept as is).
pub fn etag_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| t.strip_prefix("W/").unwrap_or(t).trim_matches('"').to_string())
        .collect()
}

fn header_str<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn date(headers: &HeaderMap, name: &header::HeaderName) -> Option<SystemTime> {
    header_str(headers, name).and_then(|v| httpdate::parse_http_date(v).ok())
}

/// HTTP dates have whole seconds; compare at that precision.
fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Evaluates If-Match, If-Unmodified-Since, If-None-Match and
/// If-Modified-Since against `current` (`None`: no representation).
pub fn evaluate(method: &Method, headers: &HeaderMap, current: Option<Validators<'_>>) -> Verdict {
    let read = method == Method::GET || method == Method::HEAD;
    if let Some(v) = header_str(headers, &header::IF_MATCH) {
        let tags = etag_list(v);
        let ok = current.is_some_and(|c| tags.iter().any(|t| t == "*" || t == c.etag));
        if !ok {
            return Verdict::Failed;
        }
    } else if let (Some(since), Some(c)) = (date(headers, &header::IF_UNMODIFIED_SINCE), current)
        && secs(c.modified) > secs(since)
    {
        return Verdict::Failed;
    }
    if let Some(v) = header_str(headers, &header::IF_NONE_MATCH) {
        let tags = etag_list(v);
        let matched = current.is_some_and(|c| tags.iter().any(|t| t == "*" || t == c.etag));
        if matched {
            return if read { Verdict::NotModified } else { Verdict::Failed };
        }
    } else if let (true, Some(since), Some(c)) = (read, date(headers, &header::IF_MODIFIED_SINCE), current)
        && secs(c.modified) <= secs(since)
    {
        return Verdict::NotModified;
    }
    Verdict::Proceed
}

/// Whether a Range request may be served partially: true without
/// `If-Range`, or when its strong ETag or exact date matches.
pub fn if_range_holds(headers: &HeaderMap, current: Validators<'_>) -> bool {
    let Some(v) = header_str(headers, &header::IF_RANGE) else {
        return true;
    };
    let v = v.trim();
    if v.starts_with('"') {
        return v.trim_matches('"') == current.etag;
    }
    if v.starts_with("W/") {
        return false; // weak tags never match for ranges
    }
    httpdate::parse_http_date(v).is_ok_and(|d| secs(d) == secs(current.modified))
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
        Some(Validators { etag: "abc", modified: at(NOW) })
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
    }

    #[test]
    fn if_range_needs_a_strong_match() {
        let c = cur().unwrap();
        assert!(if_range_holds(&headers(&[]), c));
        assert!(if_range_holds(&headers(&[("if-range", "\"abc\"")]), c));
        assert!(!if_range_holds(&headers(&[("if-range", "\"old\"")]), c));
        assert!(!if_range_holds(&headers(&[("if-range", "W/\"abc\"")]), c));
        assert!(if_range_holds(&headers(&[("if-range", &httpdate::fmt_http_date(at(NOW)))]), c));
        assert!(!if_range_holds(&headers(&[("if-range", &httpdate::fmt_http_date(at(NOW - 1)))]), c));
    }
}
