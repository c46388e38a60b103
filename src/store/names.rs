//! Bucket and key rules. A key is text, never a path: it is checked here
//! only for length and NUL, and no component of the store ever turns it into
//! a file name.

/// What a key (or a bucket name) is escaped of in a URL's path: every byte
/// but RFC 3986's unreserved characters and `/`, as S3 (SigV4 and
/// `encoding-type=url`) has it.
pub const URL_PATH: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'/').remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// A key as a URL path, which reaches the server unchanged. URL libraries
/// and browsers remove `.` and `..` segments, escaped or not (RFC 3986
/// section 5.2.4, the WHATWG URL standard), and would send `a/../b` as `b`.
/// So the `/` that makes such a segment one, before it or (first in the
/// key) after it, goes as `%2F`, which the server reads as `/`. A key that
/// is nothing but `.` or `..` has no `/` to hide behind: `None`.
pub fn key_path(key: &str) -> Option<String> {
    let dot = |s: &str| s == "." || s == "..";
    if dot(key) {
        return None;
    }
    let segments: Vec<&str> = key.split('/').collect();
    let mut path = String::new();
    for (i, segment) in segments.iter().enumerate() {
        if i > 0 {
            path.push_str(if dot(segment) || (i == 1 && dot(segments[0])) { "%2F" } else { "/" });
        }
        path.extend(percent_encoding::utf8_percent_encode(segment, URL_PATH));
    }
    Some(path)
}

/// Longest key, in bytes, as in S3: the default of `--max-key-bytes`.
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks a bucket name against S3's rules: 3-63 characters of lowercase
/// letters, digits, `.` and `-`, starting and ending with a letter or digit,
/// no `..`, and not shaped like an IP address.
pub fn check_bucket(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    if !(3..=63).contains(&b.len()) {
        return Err(format!("bucket name {name:?} must be 3 to 63 characters long"));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '.' || *c == '-')) {
        return Err(format!("bucket name {name:?} has {c:?}: only lowercase letters, digits, '.' and '-' are allowed"));
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Err(format!("bucket name {name:?} must start and end with a letter or digit"));
    }
    if name.contains("..") {
        return Err(format!("bucket name {name:?} must not contain \"..\""));
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(format!("bucket name {name:?} must not look like an IP address"));
    }
    Ok(())
}

/// Checks the name of a bucket to be created: [`check_bucket`], and none
/// of the prefixes and suffixes S3 reserves for its own kinds of bucket
/// and alias, which SDKs treat apart (boto3 signs for a `--x-s3` bucket
/// as for S3 Express). Existing buckets are only held to
/// [`check_bucket`], so a store made before stays reachable.
pub fn check_new_bucket(name: &str) -> Result<(), String> {
    check_bucket(name)?;
    const PREFIXES: [&str; 3] = ["xn--", "sthree-", "amzn-s3-demo-"];
    const SUFFIXES: [&str; 5] = ["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"];
    if let Some(p) = PREFIXES.iter().find(|p| name.starts_with(*p)) {
        return Err(format!("bucket name {name:?} must not start with {p:?}, which S3 reserves"));
    }
    if let Some(s) = SUFFIXES.iter().find(|s| name.ends_with(*s)) {
        return Err(format!("bucket name {name:?} must not end with {s:?}, which S3 reserves"));
    }
    Ok(())
}

/// Checks a key: 1 to `max` bytes of UTF-8 without NUL.
pub fn check_key(key: &str, max: usize) -> Result<(), String> {
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    if key.len() > max {
        return Err(format!("the key is {} bytes long; at most {max} are allowed", key.len()));
    }
    if key.contains('\0') {
        return Err("the key contains a NUL character".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path the server gets, after a URL library has had its way.
    fn sent(key: &str) -> String {
        let url = reqwest::Url::parse(&format!("http://depot/files/{}", key_path(key).unwrap())).unwrap();
        let path = url.path().strip_prefix("/files/").expect("the bucket stays").to_string();
        percent_encoding::percent_decode_str(&path).decode_utf8().unwrap().into_owned()
    }

    #[test]
    fn keys_with_dot_segments_reach_the_server_whole() {
        for key in
            ["a/../b", "../x", "./x", "a/.", "a/..", "../..", "a/./b/../c", "a//b", "%2e%2e/x", "x y/é?#", "d/sub/../"]
        {
            assert_eq!(sent(key), key);
        }
        assert_eq!(key_path("plain/key.txt").unwrap(), "plain/key.txt", "no needless escapes");
        assert!(key_path("..").is_none() && key_path(".").is_none());
    }

    #[test]
    fn new_buckets_keep_clear_of_the_names_s3_reserves() {
        for reserved in
            ["xn--abc", "sthree-x1", "amzn-s3-demo-b", "foo-s3alias", "abc--ol-s3", "a.mrap", "d--x-s3", "t--table-s3"]
        {
            assert!(check_new_bucket(reserved).is_err(), "{reserved}");
            assert!(check_bucket(reserved).is_ok(), "{reserved} stays reachable");
        }
        assert!(check_new_bucket("my-s3-bucket").is_ok());
        assert!(check_new_bucket("UPPER").is_err());
    }

    #[test]
    fn bucket_names_follow_s3() {
        for ok in ["files", "a-b.c", "abc", "0ab", &"a".repeat(63)] {
            assert!(check_bucket(ok).is_ok(), "{ok} should be valid");
        }
        for bad in ["ab", "Abc", "a_b", "-ab", "ab-", "a..b", "192.168.1.1", "_x_", &"a".repeat(64), "ab/c", ""] {
            assert!(check_bucket(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn keys_are_text_with_two_limits() {
        for ok in ["../../etc/passwd", "a//b", "\\", "emoji 🦀", "%2e%2e/x", &"k".repeat(1024)] {
            assert!(check_key(ok, MAX_KEY_BYTES).is_ok(), "{ok:?} should be valid");
        }
        assert!(check_key("", MAX_KEY_BYTES).is_err());
        assert!(check_key("a\0b", MAX_KEY_BYTES).is_err());
        assert!(check_key(&"k".repeat(1025), MAX_KEY_BYTES).is_err());
        assert!(check_key("abcd", 3).is_err(), "the limit is a parameter");
    }
}
