//! What depot does with S3 requests before and around s3s: which API a
//! request goes to, presigned expiry, virtual-host Host headers, s3s's path
//! parsers, and the checksums declared for an upload body.
#![no_main]

use bytes::Bytes;
use depot::http::fuzzing::{checksummed_upload, headers, s3_routing, virtual_host};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (target, rest) = text.split_once('\n').unwrap_or((text, ""));
    let h = headers(rest.as_bytes());
    let _ = s3_routing(target, h.clone());

    let path = target.split('?').next().unwrap_or("");
    let _ = s3s::path::parse_path_style(path);
    let host = rest.lines().next().unwrap_or("");
    let domain = "s3.example.com";
    if let Ok((Some(bucket), _)) = virtual_host(domain, host) {
        assert!(!bucket.is_empty());
        // Host names are matched in any case; a bucket's name is lower case.
        assert!(!bucket.bytes().any(|b| b.is_ascii_uppercase()), "{host:?} gave bucket {bucket:?}");
        assert!(host.to_ascii_lowercase().starts_with(&format!("{bucket}.{domain}")), "{host:?} gave bucket {bucket:?}");
        let _ = s3s::path::parse_virtual_hosted_style(Some(&bucket), path);
    }

    let body = Bytes::copy_from_slice(rest.as_bytes());
    let pieces = vec![body.slice(..body.len() / 2), body.slice(body.len() / 2..)];
    if let Ok(n) = checksummed_upload(&h, pieces) {
        assert_eq!(n, body.len());
    }
});
