//! The S3 API on the native port. Requests signed with AWS SigV4 (header or
//! presigned query), and unsigned requests naming an S3 sub-resource, go to
//! an `s3s` service: it parses the S3 REST protocol and XML, checks
//! signatures (aws-chunked bodies and their chunk signatures included) and
//! turns [`ops::DepotS3`]'s answers and errors into S3 responses.
//!
//! On a server with credentials, a request with neither a signature nor a
//! Bearer token comes here too, as an anonymous S3 request.
//!
//! Who may do what: a signed request with a configured credential may use
//! its own buckets and those created without credentials; an anonymous one
//! may only read and list buckets marked public-read.

pub(super) mod body;
mod completion;
mod form;
pub(crate) mod framing;
mod ops;

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;

use http_body_util::BodyExt;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::host::{S3Host, VirtualHost};
use s3s::path::S3Path;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};

use super::error::ApiError;
use super::{Request, Response};
use crate::config::Credential;
use crate::http::may_use;
use crate::store::{Store, StoreError};

/// Query parameters that only S3 requests carry: an unsigned request with
/// one of them is an anonymous S3 request, not a native one.
const S3_QUERY: &[&str] =
    &["list-type", "encoding-type", "uploads", "uploadId", "delete", "location", "versions", "acl", "marker"];

/// Whether a request is for the S3 API rather than the native one.
pub fn is_s3<B>(req: &http::Request<B>) -> bool {
    if let Some(auth) = req.headers().get(http::header::AUTHORIZATION)
        && (auth.as_bytes().starts_with(b"AWS4-") || auth.as_bytes().starts_with(b"AWS "))
    {
        return true;
    }
    let query = req.uri().query().unwrap_or("");
    form_urlencoded::parse(query.as_bytes()).any(|(name, _)| {
        name == "X-Amz-Signature" || name == "X-Amz-Credential" || name == "Signature" || S3_QUERY.contains(&&*name)
    })
}

/// Builds the S3 service over a store.
pub fn service(store: Arc<Store>, credentials: &[Credential], domain: Option<&str>) -> anyhow::Result<S3Service> {
    let mut builder = S3ServiceBuilder::new(ops::DepotS3 { store: store.clone() });
    let keys = credentials.iter().map(|c| (c.access_key.clone(), SecretKey::from(c.secret_key.clone()))).collect();
    builder.set_auth(Keys(keys));
    builder.set_access(Policy { store });
    let mut config = s3s::config::S3Config::default();
    config.post_object_max_file_size = MAX_FORM_FILE;
    // Its own bounds (20 MB of fields) would hold far more than S3 takes.
    config.form_max_fields_size = form::MAX_FIELDS;
    config.form_max_field_size = form::MAX_FIELDS;
    builder.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(config))));
    if let Some(domain) = domain {
        if domain.is_empty() || domain.contains([':', '/']) {
            anyhow::bail!("--s3-domain {domain:?} must be a bare domain name, like s3.example.com");
        }
        builder.set_host(Domain(domain.to_ascii_lowercase()));
    }
    Ok(builder.build())
}

/// Longest validity of a presigned URL, as S3 has it: seven days.
const MAX_EXPIRES: u64 = 7 * 24 * 3600;

/// Most a SigV2 request's date may be off from the server's clock, as S3
/// allows.
const MAX_SKEW: u64 = 15 * 60;

/// The algorithm of SigV4a, S3's signatures for several regions at once.
const SIGV4A: &str = "AWS4-ECDSA-P256-SHA256";

/// The headers a SigV4 `Authorization` header signs, read as strictly as
/// the protocol layer reads the header: the algorithm, then exactly the
/// credential, the signed headers and the signature. `None` when it is not
/// such a header; reading it more loosely than the protocol layer (say,
/// `SignedHeaders=` hidden in the algorithm) would let a header through
/// that the signature does not cover.
fn sigv4_signed_headers(auth: &str) -> Option<&str> {
    let (algorithm, rest) = auth.split_once(|c: char| c.is_ascii_whitespace())?;
    if algorithm != "AWS4-HMAC-SHA256" {
        return None;
    }
    let mut parts = rest.split(',');
    let (Some(credential), Some(signed), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if !credential.trim().starts_with("Credential=") || !signature.trim().starts_with("Signature=") {
        return None;
    }
    // Up to the comma, as the protocol layer reads it: a space before the
    // comma is part of the last name.
    signed.trim_start().strip_prefix("SignedHeaders=")
}

/// Whether every name of a SigV4 signed-header list is one the protocol
/// layer finds as it is written: a header name in lowercase, as SigV4
/// writes them. The protocol layer looks each name up byte for byte and
/// leaves out of the signature one that matches no header, so a name in
/// capitals, or with a space, added to a captured request's list would
/// change nothing it checks while passing for the name of a header added
/// with it.
fn names_as_signed(signed: &str) -> bool {
    signed.split(';').all(|name| {
        !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b))
    })
}

/// What S3 refuses about a request's signing and the protocol layer lets
/// through, checked before it; the authorization and the query are read
/// once for all of it:
/// - a presigned URL whose `X-Amz-Expires` is outside 1 s to 7 days;
/// - a SigV4 request carrying an `x-amz-*` header it did not sign ("There
///   were headers present in the request which were not signed"): added to
///   a presigned URL or a signed request, one could turn a PUT into a copy
///   of the signer's private object, or a new bucket public; so also a
///   request signed both in its query and in an Authorization header, and
///   an Authorization header that names another algorithm than SigV4's or
///   is not laid out as SigV4's is;
/// - a SigV2 request signed more than 15 minutes from now, or a SigV2
///   presigned URL valid for longer than 7 days: either could be replayed
///   for ever;
/// - a SigV4a signature, which is not supported (501).
pub(super) fn refused_signing<B>(req: &http::Request<B>) -> Option<S3Error> {
    let query: Vec<_> = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).collect();
    let param = |name: &str| query.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_ref());
    let now = std::time::SystemTime::now();
    let refuse = |message: &'static str| Some(bad_request("AuthorizationQueryParametersError", message));
    // One Authorization header, of visible ASCII, read here as the protocol
    // layer reads it: it takes any UTF-8 value and passes over others, so
    // a header this check could not read might still be the one checked.
    let mut auths = req.headers().get_all(http::header::AUTHORIZATION).iter();
    let auth = match (auths.next(), auths.next()) {
        (None, _) => "",
        (Some(one), None) => match one.to_str() {
            Ok(auth) => auth,
            Err(_) => {
                return Some(bad_request("AuthorizationHeaderMalformed", "the Authorization header is not ASCII"));
            }
        },
        (Some(_), Some(_)) => {
            return Some(bad_request("AuthorizationHeaderMalformed", "a request carries one Authorization header"));
        }
    };

    if auth.starts_with(SIGV4A) || param("X-Amz-Algorithm") == Some(SIGV4A) {
        return Some(s3_error!(NotImplemented, "ECDSA signatures (SigV4a) are not supported: sign with SigV4"));
    }
    if let Some(expires) = param("X-Amz-Expires")
        && !expires.parse::<u64>().is_ok_and(|secs| (1..=MAX_EXPIRES).contains(&secs))
    {
        return refuse("X-Amz-Expires must be between 1 and 604800 seconds (7 days)");
    }
    // The signature the protocol layer checks, found as it finds it: a
    // SigV2 one first (it signs every `x-amz-*` header sent), then a SigV4
    // presigned URL's, then the Authorization header's.
    let presigned = param("Signature").is_some() || param("X-Amz-Signature").is_some();
    if presigned && !auth.is_empty() {
        return refuse("a request is signed either in its query or in its Authorization header, not in both");
    }
    let sigv2 = param("Signature").is_some() || auth.strip_prefix("AWS ").is_some_and(|a| a.contains(':'));
    // SigV2 signs a sub-resource (`?acl`, `?uploads`, ...) given once; one
    // given twice the protocol layer leaves out of what it signs, yet still
    // routes by, so a signed request could be made another operation.
    let mut seen = std::collections::HashSet::new();
    if sigv2 && let Some((name, _)) = query.iter().find(|(name, _)| !seen.insert(name)) {
        return Some(bad_request(
            "InvalidArgument",
            format!("the query parameter {name} is given twice; a SigV2 request names each once"),
        ));
    }
    let signed = if sigv2 {
        None
    } else if param("X-Amz-Signature").is_some() {
        Some(param("X-Amz-SignedHeaders").unwrap_or(""))
    } else if auth.is_empty() {
        None
    } else {
        match sigv4_signed_headers(auth) {
            Some(signed) => Some(signed),
            None => {
                return Some(bad_request(
                    "AuthorizationHeaderMalformed",
                    "the Authorization header is not `AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., \
                     Signature=...`",
                ));
            }
        }
    };
    if let Some(signed) = signed {
        if !names_as_signed(signed) {
            return Some(bad_request(
                "AuthorizationHeaderMalformed",
                "the signed headers must be header names in lowercase, separated by `;`",
            ));
        }
        // As S3 does: unsigned, the host could be changed, and with it the
        // bucket of a virtual-host request.
        if !signed.split(';').any(|s| s == "host") {
            return Some(S3Error::with_message(S3ErrorCode::AccessDenied, "the Host header must be signed"));
        }
        let unsigned: Vec<&str> = req
            .headers()
            .keys()
            .map(|name| name.as_str())
            .filter(|name| name.starts_with("x-amz-") && !signed.split(';').any(|s| s == *name))
            .collect();
        if !unsigned.is_empty() {
            let message =
                format!("There were headers present in the request which were not signed: {}", unsigned.join(", "));
            return Some(S3Error::with_message(S3ErrorCode::AccessDenied, message));
        }
    }
    if auth.starts_with("AWS ") {
        let date = ["x-amz-date", "date"].iter().find_map(|h| req.headers().get(*h)?.to_str().ok());
        let skew = date
            .and_then(sigv2_date)
            .map(|t| t.duration_since(now).or_else(|_| now.duration_since(t)).unwrap_or_default().as_secs());
        match skew {
            None => {
                return Some(S3Error::with_message(
                    S3ErrorCode::AccessDenied,
                    "AWS authentication requires a valid Date or x-amz-date header",
                ));
            }
            Some(s) if s > MAX_SKEW => {
                return Some(S3Error::with_message(
                    S3ErrorCode::RequestTimeTooSkewed,
                    "a SigV2 request needs a Date within 15 minutes of the server's time",
                ));
            }
            Some(_) => {}
        }
    }
    if param("Signature").is_some() && param("AWSAccessKeyId").is_some() {
        let latest = crate::catalog::to_millis(now) / 1000 + MAX_EXPIRES;
        if param("Expires").and_then(|e| e.parse::<u64>().ok()).is_none_or(|e| e > latest) {
            return refuse("a SigV2 presigned URL needs Expires within 7 days from now");
        }
    }
    None
}

/// The query parameters of a SigV4 presigned URL that are its signature,
/// not request headers.
const PRESIGNING: &[&str] = &[
    "x-amz-algorithm",
    "x-amz-credential",
    "x-amz-date",
    "x-amz-expires",
    "x-amz-signedheaders",
    "x-amz-signature",
    "x-amz-security-token",
];

/// Largest document read whole to check it: a DeleteObjects of 1,000
/// keys of 1,024 bytes, escaped, stays well below.
const MAX_DOCUMENT: usize = 16 << 20;

/// Largest file a form upload takes. The protocol layer reads a form's
/// file whole into memory before it checks the policy's conditions and
/// stores it, so this bounds the memory each form holds; larger files go
/// by PUT or multipart upload, which stream.
pub const MAX_FORM_FILE: u64 = 64 << 20;

/// Whether a query parameter of a presigned URL is left out of the
/// request as S3 leaves it out: a checksum's value, or the algorithm an
/// SDK computed it in. SDKs hoist into the URL the checksum of the body
/// they have when they sign, which for an upload is none yet (the CRC32
/// of no bytes); S3 does not check checksums given this way.
fn ignored_in_presigned_url(name: &str) -> bool {
    body::is_checksum_value(name) || name == "x-amz-sdk-checksum-algorithm"
}

/// Makes a request what the S3 service should see:
/// - the other `x-amz-*` parameters of a presigned URL (and, of a SigV2
///   one, `content-type` and `content-md5`) become headers, as S3 applies
///   them (SDKs hoist metadata into the URL, where the signature covers
///   it), less checksums ([`ignored_in_presigned_url`]);
/// - the XML document of DeleteObjects or CompleteMultipartUpload is read
///   and checked against its declared digests ([`body::check_document`]);
/// - a form upload's key gets its file's name ([`form`]); an unsigned one
///   from an `anonymous` caller (on a server with credentials) is refused
///   before its file is read, since the protocol layer reads the file
///   before it checks access.
///
/// With a document, also the [`body::Refusal`] its check leaves.
async fn prepare(req: Request, anonymous: bool) -> S3Result<(http::Request<s3s::Body>, Option<body::Refusal>)> {
    let (mut parts, body) = req.into_parts();
    let query: Vec<(String, String)> =
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()).into_owned().collect();
    let sigv4 = query.iter().any(|(n, _)| n == "X-Amz-Signature");
    // A SigV2 URL signs every `x-amz-*` header, and the content's type and
    // MD5, from what SDKs put in its query: here too they become headers.
    let sigv2 = ["Signature", "AWSAccessKeyId"].iter().all(|p| query.iter().any(|(n, _)| n == p));
    if sigv4 || sigv2 {
        for (name, value) in &query {
            let name = name.to_ascii_lowercase();
            let content = sigv2 && (name == "content-type" || name == "content-md5");
            if !(name.starts_with("x-amz-") || content)
                || PRESIGNING.contains(&name.as_str())
                || ignored_in_presigned_url(&name)
                || parts.headers.contains_key(&name)
            {
                continue;
            }
            let (Ok(name), Ok(value)) =
                (http::HeaderName::from_bytes(name.as_bytes()), http::HeaderValue::from_str(value))
            else {
                return Err(s3_error!(InvalidArgument, "the query parameter {name} is not a valid header"));
            };
            parts.headers.insert(name, value);
        }
    }
    join_repeated(&mut parts.headers, http::header::CONTENT_ENCODING);
    join_repeated(&mut parts.headers, http::header::IF_MATCH);
    join_repeated(&mut parts.headers, http::header::IF_NONE_MATCH);
    let signed = sigv4_signed(&parts.headers, &query);
    drop_malformed(&mut parts.headers, &signed);
    // Whatever its query, as the protocol layer takes it.
    if parts.method == http::Method::POST
        && let Some(boundary) = form::boundary(&parts.headers)
    {
        let mut length = super::content_length(&parts.headers);
        let form = form::with_filename(body, &boundary, &mut length)
            .await
            .map_err(|e| s3_error!(InvalidRequest, "reading the form failed: {e}"))?;
        if anonymous && !form.signed {
            return Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                "a form upload to this server needs a policy signed with one of its credentials",
            ));
        }
        // The protocol layer has no place for them: they would be lost.
        body::refuse_unknown_checksum(form.fields.iter().map(String::as_str))?;
        if let Some(length) = length {
            parts.headers.insert(http::header::CONTENT_LENGTH, length.into());
        }
        return Ok((http::Request::from_parts(parts, form.body), None));
    }
    let delete = query.iter().any(|(n, _)| n == "delete");
    let document = parts.method == http::Method::POST && (delete || query.iter().any(|(n, _)| n == "uploadId"));
    let payload = parts.headers.get("x-amz-content-sha256").map(http::HeaderValue::as_bytes).unwrap_or_default();
    if payload.starts_with(b"STREAMING-") {
        // Its Content-MD5 and checksums are checked against the document
        // whole, which the chunks' framing would hide: with unsigned
        // chunks nothing else would stand for the keys it names.
        if document {
            return Err(s3_error!(
                InvalidRequest,
                "send this document whole, not in aws-chunked encoding, so that its checksum can be checked"
            ));
        }
        let unsigned = payload == b"STREAMING-UNSIGNED-PAYLOAD-TRAILER";
        return Ok((
            http::Request::from_parts(parts, s3s::Body::http_body(framing::Checked::new(body, unsigned))),
            None,
        ));
    }
    if !document {
        return Ok((http::Request::from_parts(parts, s3s::Body::http_body(body)), None));
    }
    // CompleteMultipartUpload's x-amz-checksum-* are the object's, checked
    // as it completes (`completion`).
    let (body, refusal) = body::Document::new(body, parts.headers.clone(), delete, MAX_DOCUMENT);
    Ok((http::Request::from_parts(parts, s3s::Body::http_body(body)), Some(refusal)))
}

/// Headers that are ignored when malformed rather than refused, as the
/// protocol layer would refuse them (400): a Range that is not one byte
/// range (several, `bytes=5-1`, another unit) asks for the whole object,
/// as S3 has it and RFC 9110 (section 14.2) allows, and a date condition
/// that is not a date does not apply (section 13.1.3).
const IGNORED_IF_MALFORMED: [http::HeaderName; 3] =
    [http::header::RANGE, http::header::IF_MODIFIED_SINCE, http::header::IF_UNMODIFIED_SINCE];

/// Leaves out the [`IGNORED_IF_MALFORMED`] headers that are malformed or
/// given twice, unless `signed` (the headers a SigV4 signature covers,
/// `;`-separated) names them: without them the signature would not match,
/// so the protocol layer refuses them then.
fn drop_malformed(headers: &mut http::HeaderMap, signed: &str) {
    for name in IGNORED_IF_MALFORMED {
        let mut values = headers.get_all(&name).iter();
        let malformed = match (values.next(), values.next()) {
            (None, _) => false,
            (Some(value), None) => !value.to_str().is_ok_and(|v| well_formed(&name, v)),
            (Some(_), Some(_)) => true,
        };
        if malformed && !signed.split(';').any(|s| s.eq_ignore_ascii_case(name.as_str())) {
            headers.remove(&name);
        }
    }
}

/// Whether the protocol layer reads a value of one of the
/// [`IGNORED_IF_MALFORMED`] headers.
fn well_formed(name: &http::HeaderName, value: &str) -> bool {
    match *name {
        http::header::RANGE => s3s::dto::Range::parse(value).is_ok(),
        _ => s3s::dto::Timestamp::parse(s3s::dto::TimestampFormat::HttpDate, value).is_ok(),
    }
}

/// The headers a request's SigV4 signature covers, `;`-separated, from its
/// presigned query or its Authorization header; none for an unsigned
/// request or a SigV2 one, which signs no header of
/// [`IGNORED_IF_MALFORMED`].
fn sigv4_signed(headers: &http::HeaderMap, query: &[(String, String)]) -> String {
    if let Some((_, signed)) = query.iter().find(|(n, _)| n == "X-Amz-SignedHeaders") {
        return signed.clone();
    }
    let auth = headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    sigv4_signed_headers(auth).unwrap_or_default().to_string()
}

/// Makes a list header given on several lines one line, as RFC 9110
/// (section 5.3) reads it and as SigV4 signs it (the values joined by
/// commas). SDKs send a stored `Content-Encoding` and the upload's
/// `aws-chunked` on two lines; the protocol layer refuses a repeated header.
fn join_repeated(headers: &mut http::HeaderMap, name: http::HeaderName) {
    if headers.get_all(&name).iter().nth(1).is_none() {
        return;
    }
    let values: Vec<&[u8]> = headers.get_all(&name).iter().map(http::HeaderValue::as_bytes).collect();
    if let Ok(joined) = http::HeaderValue::from_bytes(&values.join(&b","[..])) {
        headers.insert(name, joined);
    }
}

/// An XML answer put right where the protocol layer writes it wrong or
/// short: a carriage return in a key is written `&#13;` (an XML reader takes
/// a raw one for a line feed, so the client would read another key), and an
/// error names its request (`RequestId`) and the path it was for
/// (`Resource`), and says what a failed signature means, as S3's errors do.
/// A form upload's answer (`success_action_status=201`) quotes its ETag,
/// and a form field its policy does not allow is 403 `AccessDenied`, as on
/// S3.
fn finish_xml(mut response: http::Response<s3s::Body>, request_id: &str, resource: &str) -> http::Response<s3s::Body> {
    let xml = response.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes() == b"application/xml");
    let Some(document) = response.body().bytes().filter(|_| xml) else { return response };
    let error = response.status().as_u16() >= 300;
    let posted = response.status() == http::StatusCode::CREATED;
    // Most answers need none of it: they are passed on without a copy.
    if !(document.contains(&b'\r') || error || posted) {
        return response;
    }
    let Ok(mut text) = String::from_utf8(document.to_vec()) else { return response };
    text = text.replace('\r', "&#13;");
    if posted && let Some(tag) = between(&text, "<ETag>", "</ETag>").filter(|t| !t.starts_with('"')) {
        text = text.replacen(&format!("<ETag>{tag}</ETag>"), &format!("<ETag>\"{tag}\"</ETag>"), 1);
    }
    if between(&text, "<Code>", "</Code>") == Some("InvalidPolicyDocument")
        && let Some(message) = between(&text, "<Message>", "</Message>").filter(|m| m.starts_with("Policy condition"))
    {
        let denied = format!("Invalid according to Policy: {message}");
        text = text.replacen("<Code>InvalidPolicyDocument</Code>", "<Code>AccessDenied</Code>", 1).replacen(
            &format!("<Message>{message}</Message>"),
            &format!("<Message>{denied}</Message>"),
            1,
        );
        *response.status_mut() = http::StatusCode::FORBIDDEN;
    }
    if error && let Some(end) = text.rfind("</Error>") {
        let mut more = String::new();
        if !text.contains("<Resource>") {
            more.push_str(&format!("<Resource>{}</Resource>", super::listing::escape(resource)));
        }
        if !text.contains("<RequestId>") {
            more.push_str(&format!("<RequestId>{request_id}</RequestId>"));
        }
        text.insert_str(end, &more);
        if !text.contains("<Message>")
            && let Some(message) = between(&text, "<Code>", "</Code>").and_then(missing_message)
            && let Some(code_end) = text.find("</Code>").map(|at| at + "</Code>".len())
        {
            text.insert_str(code_end, &format!("<Message>{message}</Message>"));
        }
    }
    *response.body_mut() = s3s::Body::from(text);
    response
}

/// The text between the first `open` and the `close` after it.
fn between<'t>(text: &'t str, open: &str, close: &str) -> Option<&'t str> {
    let start = text.find(open)? + open.len();
    Some(&text[start..start + text[start..].find(close)?])
}

/// What S3 says when a request's signature does not match.
/// The messages of errors the protocol layer gives without one, as S3
/// words them, so that clients do not print "Unknown".
fn missing_message(code: &str) -> Option<&'static str> {
    match code {
        "SignatureDoesNotMatch" => Some(
            "The request signature we calculated does not match the signature you provided. Check your key and \
             signing method.",
        ),
        "MalformedXML" => {
            Some("The XML you provided was not well-formed or did not validate against our published schema")
        }
        "InvalidBucketName" => Some(
            "The specified bucket is not valid: a bucket name is 3 to 63 lowercase letters, digits, dots and \
             hyphens, and starts and ends with a letter or digit",
        ),
        _ => None,
    }
}

/// How long a CompleteMultipartUpload works before its answer begins, and
/// how often it then sends a space (see [`kept_alive`]). SDKs give up on a
/// socket silent for 30 s (the Java SDK) to 60 s (boto3).
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The start of every XML answer.
const XML_DECLARATION: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";

/// Answers one S3 request; `anonymous`: from a caller without a Bearer
/// token on a server with credentials (a signature is checked later).
pub async fn handle(service: &S3Service, req: Request, anonymous: bool, request_id: &str) -> Response {
    let query = req.uri().query().unwrap_or("");
    let completion = req.method() == http::Method::POST
        && form_urlencoded::parse(query.as_bytes()).any(|(name, _)| name == "uploadId");
    if completion {
        let (service, id) = (service.clone(), request_id.to_string());
        // Its log lines name the request, as on the request's own task.
        let work = super::log::scope(id.clone(), async move { answer(&service, req, anonymous, &id).await });
        return kept_alive(tokio::spawn(work), KEEP_ALIVE, request_id).await;
    }
    answer(service, req, anonymous, request_id).await
}

/// A CompleteMultipartUpload's answer, kept alive as S3 keeps it: Complete
/// reads every part back, which for a large object can outlast a client's
/// patience with a silent socket. Work that takes longer than `every` is
/// answered 200 at once, with the XML declaration, then a space every
/// `every`, then the document it ends with, the result or an error (S3's
/// clients look for an error in a Complete's 200). The work goes on to its
/// end if the client goes away, as it would on S3.
/// A failure after the 200 is logged here, with `request_id`: the
/// server's own log of the request saw a 200.
async fn kept_alive(mut work: tokio::task::JoinHandle<Response>, every: Duration, request_id: &str) -> Response {
    tokio::select! {
        done = &mut work => return joined(done),
        () = tokio::time::sleep(every) => {}
    }
    let id = request_id.to_string();
    let spaces = futures::stream::unfold(Some(work), move |work| {
        let id = id.clone();
        async move {
            let mut work = work?;
            tokio::select! {
                done = &mut work => {
                    let answer = joined(done);
                    if !answer.status().is_success() {
                        let status = answer.status().as_u16();
                        tracing::warn!(status, request_id = %id, "a CompleteMultipartUpload answered 200 ahead of its outcome failed");
                    }
                    Some((document(answer).await, None))
                }
                () = tokio::time::sleep(every) => Some((Ok(Bytes::from_static(b" ")), Some(work))),
            }
        }
    });
    let start = futures::stream::once(async { Ok(Bytes::from_static(XML_DECLARATION.as_bytes())) });
    let body = http_body_util::StreamBody::new(start.chain(spaces).map(|chunk| chunk.map(hyper::body::Frame::data)));
    let mut response = http::Response::new(body.boxed_unsync());
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
    response
}

/// The answer of finished work; a panic in it is an `InternalError`.
fn joined(done: Result<Response, tokio::task::JoinError>) -> Response {
    done.unwrap_or_else(|e| {
        tracing::error!("an S3 request failed: {e}");
        super::error_response(&ApiError::new(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the S3 request could not be answered",
        ))
    })
}

/// An XML answer's document without its declaration, to follow the one
/// [`kept_alive`] sent; any other answer as S3's `InternalError`.
async fn document(answer: Response) -> io::Result<Bytes> {
    let xml = answer.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes() == b"application/xml");
    let body = answer.into_body().collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    let text = text.trim_start();
    if !xml {
        let message = super::listing::escape(text);
        return Ok(Bytes::from(format!("<Error><Code>InternalError</Code><Message>{message}</Message></Error>")));
    }
    let document = match text.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").map_or(rest, |(_, after)| after).trim_start(),
        None => text,
    };
    Ok(Bytes::copy_from_slice(document.as_bytes()))
}

/// Answers one S3 request, as [`handle`] does.
async fn answer(service: &S3Service, req: Request, anonymous: bool, request_id: &str) -> Response {
    let head = req.method() == http::Method::HEAD;
    let resource = req.uri().path().to_string();
    let prepared = match refused_signing(&req) {
        Some(e) => Err(e),
        None => prepare(req, anonymous).await,
    };
    let answer = match prepared {
        Err(e) => Err(e),
        Ok((req, refusal)) => {
            let answer = service.call(req).await;
            match refusal.and_then(|r| r.lock().expect("not poisoned").take()) {
                Some(e) => Err(e),
                None => Ok(answer),
            }
        }
    };
    let answer = answer.unwrap_or_else(|e| e.to_http_response().map_err(|e| s3s::HttpError::new(Box::new(e))));
    let mut response = match answer {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("S3 request failed: {e:?}");
            return super::error_response(&ApiError::new(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "the S3 request could not be answered",
            ));
        }
    };
    response = finish_xml(response, request_id, &resource);
    // HeadObject of a range answers 206, as GetObject does; the protocol
    // layer answers every HeadObject with 200.
    if head && response.status() == http::StatusCode::OK && response.headers().contains_key(http::header::CONTENT_RANGE)
    {
        *response.status_mut() = http::StatusCode::PARTIAL_CONTENT;
    }
    response.map(|b| b.map_err(io::Error::other).boxed_unsync())
}

/// S3's SlowDown (503): too many requests at once.
pub fn slow_down(message: String, request_id: &str) -> Response {
    let mut e = S3Error::new(S3ErrorCode::SlowDown);
    e.set_message(message);
    e.set_request_id(request_id);
    match e.to_http_response() {
        Ok(r) => r.map(|b| b.map_err(io::Error::other).boxed_unsync()),
        Err(_) => super::error_response(&ApiError::new(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "SlowDown",
            "too many requests at once",
        )),
    }
}

/// Virtual-host style addressing under one domain: `BUCKET.DOMAIN[:port]`
/// names a bucket; any other host (the domain itself, an IP address,
/// `localhost`) is path style. (s3s's own `SingleDomain` compares the Host
/// header with its port and takes unknown hosts for bucket names, which
/// would break path-style requests to `127.0.0.1:8080`.)
pub(crate) struct Domain(pub(crate) String);

/// The bucket a Host header (`BUCKET.DOMAIN[:port]`) names under `domain`.
/// Host names are matched without regard to case (RFC 9110, section
/// 4.2.3), as the bucket's own name is: see [`Domain`].
pub(crate) fn bucket_in_host<'a>(host: &'a str, domain: &str) -> Option<&'a str> {
    let name = host_name(host);
    let cut = name.len().checked_sub(domain.len() + 1).filter(|&cut| cut > 0)?;
    let (bucket, dot_domain) = (name.get(..cut)?, name.get(cut..)?);
    dot_domain.strip_prefix('.').is_some_and(|d| d.eq_ignore_ascii_case(domain)).then_some(bucket)
}

/// A Host header without its port.
fn host_name(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

impl S3Host for Domain {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        // Bucket names are lower case: `REV.s3.test` is the bucket `rev`.
        Ok(match bucket_in_host(host, &self.0) {
            Some(bucket) => VirtualHost::new(self.0.as_str()).with_bucket(bucket.to_ascii_lowercase()),
            None => VirtualHost::new(host_name(host)),
        })
    }
}

/// The configured credentials.
struct Keys(HashMap<String, SecretKey>);

#[async_trait::async_trait]
impl S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.0.get(access_key) {
            Some(secret) => Ok(secret.clone()),
            None if self.0.is_empty() => Err(s3_error!(
                InvalidAccessKeyId,
                "this server has no credentials: start it with --access-key and --secret-key to use the S3 API"
            )),
            None => Err(s3_error!(InvalidAccessKeyId, "the access key is not known to this server")),
        }
    }
}

/// Operations anyone may call on public-read buckets.
const ANONYMOUS_READS: &[&str] = &[
    "GetObject",
    "HeadObject",
    "GetObjectAttributes",
    "HeadBucket",
    "ListObjects",
    "ListObjectsV2",
    "ListObjectVersions",
    "GetBucketLocation",
];

/// Who may touch which bucket.
struct Policy {
    store: Arc<Store>,
}

#[async_trait::async_trait]
impl S3Access for Policy {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let bucket = match cx.s3_path() {
            S3Path::Root => None,
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => Some(bucket.to_string()),
        };
        let caller = cx.credentials().map(|c| c.access_key.clone());
        let op = cx.s3_op().name();
        let Some(bucket) = bucket.filter(|_| op != "CreateBucket") else {
            // ListBuckets lists the caller's own; CreateBucket answers for
            // buckets that exist.
            return if caller.is_some() { Ok(()) } else { Err(anonymous()) };
        };
        let record = match self.store.bucket(&bucket).await {
            Ok(r) => Some(r),
            // Missing or malformed: the operation itself answers with the
            // right error, for callers who may know.
            Err(StoreError::NoSuchBucket(_) | StoreError::InvalidBucketName(_)) => None,
            Err(e) => return Err(to_s3(e)),
        };
        match (caller, record) {
            (Some(_), None) => Ok(()),
            (Some(caller), Some(b)) if may_use(&b, &caller) => Ok(()),
            // Public-read is for everyone, as S3's AllUsers: signed callers
            // of other accounts too.
            (_, Some(b)) if b.public_read && ANONYMOUS_READS.contains(&op) => Ok(()),
            (Some(_), Some(_)) => Err(s3_error!(AccessDenied, "the bucket belongs to another access key")),
            (None, _) => Err(anonymous()),
        }
    }
}

fn anonymous() -> S3Error {
    s3_error!(
        AccessDenied,
        "this server needs credentials: sign the request (S3) or send Authorization: Bearer <secret>; \
         anonymous requests may only read public-read buckets"
    )
}

/// A store error as an S3 error: the status the native API gives, and
/// its code, or S3's where S3 names the error otherwise (S3 has no
/// `InvalidKey`).
fn to_s3(e: StoreError) -> S3Error {
    let code = match &e {
        StoreError::KeyTooLong(_) => Some(S3ErrorCode::KeyTooLongError),
        StoreError::InvalidKey(_) => Some(S3ErrorCode::InvalidArgument),
        _ => None,
    };
    let e = ApiError::from(e);
    with_status(code.unwrap_or_else(|| s3_code(e.code)), e)
}

/// A 400 with an S3 error code s3s has no variant for.
fn bad_request(code: &str, message: impl Into<std::borrow::Cow<'static, str>>) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::Custom(code.into()), message);
    e.set_status_code(http::StatusCode::BAD_REQUEST);
    e
}

fn api_to_s3(e: ApiError) -> S3Error {
    with_status(s3_code(e.code), e)
}

/// The S3 code of a native one: a code S3 has not (`InsufficientStorage`)
/// is kept as it is, never made a server's fault.
fn s3_code(code: &str) -> S3ErrorCode {
    S3ErrorCode::from_bytes(code.as_bytes()).unwrap_or_else(|| S3ErrorCode::Custom(code.to_string().into()))
}

/// `code` with the status and message of `e`.
fn with_status(code: S3ErrorCode, e: ApiError) -> S3Error {
    let mut err = S3Error::with_message(code, e.message);
    err.set_status_code(e.status);
    err
}

/// A SigV2 request's date: an HTTP date, as RFC 2822 allows it to end
/// too, in a numeric offset (`+0000`, as s3cmd sends it) or `UTC` (Go's
/// RFC 1123, as rclone sends it).
fn sigv2_date(value: &str) -> Option<std::time::SystemTime> {
    if let Ok(t) = httpdate::parse_http_date(value) {
        return Some(t);
    }
    let (stamp, zone) = value.trim().rsplit_once(' ')?;
    let east = match zone {
        "UTC" | "UT" => 0,
        _ => {
            let (sign, digits) = zone.split_at_checked(1)?;
            let sign = match sign {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let hhmm: i64 = digits.parse().ok().filter(|_| digits.len() == 4)?;
            sign * (hhmm / 100 * 3600 + hhmm % 100 * 60)
        }
    };
    let local = httpdate::parse_http_date(&format!("{stamp} GMT")).ok()?;
    let offset = std::time::Duration::from_secs(east.unsigned_abs());
    if east >= 0 { local.checked_sub(offset) } else { local.checked_add(offset) }
}

#[cfg(test)]
mod tests {
    use super::{Domain, bucket_in_host};
    use s3s::host::S3Host;

    /// Host names are matched without regard to case, and a bucket's name
    /// is lower case whatever case its host was written in.
    #[test]
    fn a_bucket_is_found_in_its_host_in_any_case() {
        let domain = Domain("s3.test".into());
        for host in ["rev.s3.test", "rev.S3.Test:9000", "REV.s3.test"] {
            let bucket = bucket_in_host(host, "s3.test");
            assert_eq!(bucket.map(str::to_ascii_lowercase).as_deref(), Some("rev"), "{host}");
            let parsed = domain.parse_host_header(host).unwrap();
            assert_eq!(parsed.bucket(), Some("rev"), "{host}");
        }
        // The last: the cut before the dot falls inside a character.
        for host in
            ["s3.test", ".s3.test", "S3.Test:9000", "rev.s3.test.evil", "revs3.test", "127.0.0.1:9000", "és3.test"]
        {
            assert_eq!(bucket_in_host(host, "s3.test"), None, "{host}");
        }
        assert_eq!(domain.parse_host_header("127.0.0.1:9000").unwrap().bucket(), None);
    }

    fn xml(status: u16, text: &str) -> Response {
        let mut r = http::Response::new(http_body_util::Full::new(Bytes::from(text.to_string())));
        *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
        r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
        r.map(|b| b.map_err(|never| match never {}).boxed_unsync())
    }

    async fn text(r: Response) -> (u16, String) {
        let status = r.status().as_u16();
        (status, String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
    }

    /// Work done within the first wait is answered as it is; longer work
    /// is answered 200 at once, with a space every wait, then the document
    /// of its answer, an error too.
    #[tokio::test]
    async fn kept_alive_sends_spaces_until_the_document() {
        let every = Duration::from_millis(100);
        let later = |after: u64, answer: Response| {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after)).await;
                answer
            })
        };
        let quick = kept_alive(later(0, xml(400, "<?xml version=\"1.0\"?><Error/>")), every, "t").await;
        assert_eq!(text(quick).await, (400, "<?xml version=\"1.0\"?><Error/>".into()));

        let result = format!("{XML_DECLARATION}<CompleteMultipartUploadResult/>");
        let (status, body) = text(kept_alive(later(450, xml(200, &result)), every, "t").await).await;
        assert_eq!(status, 200);
        let spaces = body.strip_prefix(XML_DECLARATION).unwrap().strip_suffix("<CompleteMultipartUploadResult/>");
        let spaces = spaces.unwrap_or_else(|| panic!("{body:?}"));
        assert!((1..=4).contains(&spaces.len()) && spaces.bytes().all(|b| b == b' '), "{body:?}");

        let error = format!("{XML_DECLARATION}<Error><Code>InternalError</Code></Error>");
        let (status, body) = text(kept_alive(later(250, xml(500, &error)), every, "t").await).await;
        assert_eq!(status, 200);
        assert!(body.starts_with(XML_DECLARATION) && body.trim_end().ends_with("<Code>InternalError</Code></Error>"));
        assert_eq!(body.matches("<?xml").count(), 1, "{body:?}");

        // Within a wait long enough for a panic's backtrace.
        let panicked = tokio::spawn(async { panic!("a bug") });
        let (status, body) = text(kept_alive(panicked, Duration::from_secs(30), "t").await).await;
        assert_eq!(status, 500, "{body}");
    }
    /// A SigV2 request may not name a query parameter twice (its signature
    /// would leave a sub-resource out, and the route still take it), and a
    /// SigV4 one must sign its host.
    #[test]
    fn signatures_that_leave_part_of_the_request_out_are_refused() {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        let v2 = |query: &str| {
            let uri = format!("/bucket?{query}");
            http::Request::builder().method("PUT").uri(uri).header("authorization", "AWS AK:c2ln").header("date", &now)
        };
        let twice = refused_signing(&v2("acl&acl").body(()).unwrap()).expect("refused");
        assert!(twice.message().is_some_and(|m| m.contains("acl is given twice")), "{twice:?}");
        assert!(refused_signing(&v2("acl").body(()).unwrap()).is_none());
        let v4 = |signed: &str| {
            let auth = format!(
                "AWS4-HMAC-SHA256 Credential=AK/20261129/us-east-1/s3/aws4_request, SignedHeaders={signed}, \
                 Signature=00"
            );
            http::Request::builder().uri("/bucket/k").header("authorization", auth).body(()).unwrap()
        };
        let unsigned = refused_signing(&v4("x-amz-content-sha256;x-amz-date")).expect("refused");
        assert_eq!(unsigned.code(), &S3ErrorCode::AccessDenied);
        assert!(refused_signing(&v4("host;x-amz-content-sha256;x-amz-date")).is_none());
    }

    #[test]
    fn sigv2_dates_may_end_in_an_offset_or_utc() {
        let gmt = sigv2_date("Fri, 27 Nov 2026 12:59:19 GMT").unwrap();
        assert_eq!(sigv2_date("Fri, 27 Nov 2026 12:59:19 +0000"), Some(gmt));
        assert_eq!(sigv2_date("Fri, 27 Nov 2026 12:59:19 UTC"), Some(gmt));
        assert_eq!(sigv2_date("Fri, 27 Nov 2026 13:59:19 +0100"), Some(gmt));
        assert_eq!(sigv2_date("Fri, 27 Nov 2026 07:29:19 -0530"), Some(gmt));
        for bad in ["Fri, 27 Nov 2026 12:59:19 +01", "Fri, 27 Nov 2026 12:59:19 CET", "yesterday", ""] {
            assert_eq!(sigv2_date(bad), None, "{bad}");
        }
    }

    use super::*;

    #[test]
    fn store_errors_keep_their_status_under_s3_codes() {
        let cases = [
            (StoreError::InvalidKey("the key contains a NUL character".into()), "InvalidArgument", 400),
            (
                StoreError::KeyTooLong("the key is 300 bytes long; at most 200 are allowed".into()),
                "KeyTooLongError",
                400,
            ),
            (StoreError::NoSuchKey("k".into()), "NoSuchKey", 404),
            (StoreError::NoSpace, "InsufficientStorage", 507),
            (StoreError::Unavailable("down".into()), "ServiceUnavailable", 503),
            (StoreError::Internal("broken".into()), "InternalError", 500),
        ];
        for (error, code, status) in cases {
            let e = to_s3(error);
            assert_eq!((e.code().as_str(), e.status_code().map(|s| s.as_u16())), (code, Some(status)));
        }
    }

    #[test]
    fn malformed_ranges_and_dates_are_left_out_unless_signed() {
        let headers = |range: &str, date: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::RANGE, range.parse().unwrap());
            h.insert(http::header::IF_MODIFIED_SINCE, date.parse().unwrap());
            h
        };
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        for bad in ["bytes=0-1,5-6", "bytes=5-1", "bytes=abc", "items=0-5"] {
            let mut h = headers(bad, "not a date");
            drop_malformed(&mut h, "host;x-amz-date");
            assert!(h.is_empty(), "{bad}");
            let mut signed = headers(bad, date);
            drop_malformed(&mut signed, "host;range;x-amz-date");
            assert_eq!(signed.len(), 2, "{bad}");
        }
        let mut good = headers("bytes=10000-", date);
        drop_malformed(&mut good, "");
        assert_eq!(good.len(), 2);
        let mut twice = headers("bytes=0-1", date);
        twice.append(http::header::RANGE, "bytes=2-3".parse().unwrap());
        drop_malformed(&mut twice, "");
        assert!(!twice.contains_key(http::header::RANGE));
    }

    #[test]
    fn xml_answers_escape_carriage_returns_and_errors_name_their_request() {
        let answer = |status: u16, body: &str| {
            let mut r = http::Response::new(s3s::Body::from(body.to_string()));
            *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
            r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
            r
        };
        let text = |r: http::Response<s3s::Body>| String::from_utf8(r.body().bytes().unwrap().to_vec()).unwrap();
        let deleted = finish_xml(answer(200, "<Deleted><Key>a\rb\nc</Key></Deleted>"), "id1", "/b");
        assert_eq!(text(deleted), "<Deleted><Key>a&#13;b\nc</Key></Deleted>");
        let error = finish_xml(answer(404, "<Error><Code>NoSuchKey</Code></Error>"), "id2", "/b/k&<");
        assert_eq!(
            text(error),
            "<Error><Code>NoSuchKey</Code><Resource>/b/k&amp;&lt;</Resource><RequestId>id2</RequestId></Error>"
        );
        let named = "<Error><Code>X</Code><Resource>/r</Resource><RequestId>given</RequestId></Error>";
        assert_eq!(text(finish_xml(answer(400, named), "id3", "/b")), named);
        for code in ["SignatureDoesNotMatch", "InvalidBucketName"] {
            let bare = finish_xml(answer(403, &format!("<Error><Code>{code}</Code></Error>")), "id4", "/b");
            let message = missing_message(code).unwrap();
            assert_eq!(
                text(bare),
                format!(
                    "<Error><Code>{code}</Code><Message>{message}</Message><Resource>/b</Resource>\
                     <RequestId>id4</RequestId></Error>"
                )
            );
        }
    }
}
