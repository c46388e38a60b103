//! The web UI: one HTML page, a script and a style sheet, embedded in the
//! binary. Browsers that open `/` or a folder of a bucket get the page;
//! the script then talks to the native API (and, for signed links and
//! anonymous visitors, to the S3 API).
//!
//! Everything under `/_/ui/` is answered here, before authentication: the
//! assets, and `/_/ui/config`, which tells the page whether it must ask for
//! credentials and which buckets anonymous visitors may read.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use http::{HeaderValue, Method, StatusCode, header};
use serde_json::json;

use super::conditional::{self, Validators, Verdict};
use super::error::ApiError;
use super::native::Endpoint;
use super::{App, Request, Response, empty, error_response, full, json};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Answers the request if it is the UI's: an asset, the configuration, or
/// a page a browser navigates to. `None`: not the UI's.
pub(super) async fn answer(app: &Arc<App>, req: &Request, anonymous: bool) -> Option<Response> {
    let path = req.uri().path();
    let read = req.method() == Method::GET || req.method() == Method::HEAD;
    if let Some(name) = path.strip_prefix("/_/ui/") {
        if !matches!(name, "app.js" | "app.css" | "config") {
            return Some(error_response(&ApiError::new(
                StatusCode::NOT_FOUND,
                "NoSuchRoute",
                format!("no route {path}"),
            )));
        }
        if !read {
            return Some(error_response(&ApiError::method_not_allowed(req.method(), "GET, HEAD")));
        }
        return Some(match name {
            "app.js" => asset(req, "text/javascript; charset=utf-8", APP_JS),
            "app.css" => asset(req, "text/css; charset=utf-8", APP_CSS),
            _ => config(app).await,
        });
    }
    (read && is_page(req, anonymous)).then(|| page(req))
}

/// What the page may load: its own script and style sheet (nothing
/// inline, so an injected tag or attribute does nothing), and this
/// server's objects in previews and players. Only the page has it: objects
/// are served with a policy of their own.
const PAGE_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                        img-src 'self'; media-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
                        frame-ancestors 'none'";

/// The page. No other site may show it in a frame: it could lay its own
/// page over the UI's buttons and have the user click Delete unawares.
fn page(req: &Request) -> Response {
    let mut r = super::listing::negotiated(asset(req, "text/html; charset=utf-8", INDEX_HTML));
    let h = r.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(PAGE_CSP));
    r
}

/// A browser navigating to the buckets or to a folder: it accepts HTML,
/// asks for no JSON, and the request is not an S3 one.
fn is_page(req: &Request, anonymous: bool) -> bool {
    let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    accept.contains("text/html")
        && !super::listing::wants_json(req)
        && !req.uri().query().is_some_and(|q| q.contains("format="))
        && may_be_page(req, anonymous)
}

/// Whether a read of this URL is answered the page when it accepts HTML:
/// its answer then depends on `Accept`, which caches must be told of
/// (RFC 9110 section 12.5.5), whichever answer it gets.
pub(super) fn may_be_page(req: &Request, anonymous: bool) -> bool {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return false;
    }
    // An anonymous request for `/` would be S3's ListBuckets, refused: the
    // page is what a browser wants there. Query strings of other anonymous
    // requests are S3's.
    if anonymous && req.uri().path() != "/" && req.uri().query().is_some() {
        return false;
    }
    if super::s3::is_s3(req) {
        return false;
    }
    match Endpoint::parse(req.uri().path()) {
        Ok(Endpoint::Root | Endpoint::Bucket(_)) => true,
        Ok(Endpoint::Object { key, .. }) => key.ends_with('/'),
        _ => false,
    }
}

/// What the page needs before it shows anything.
async fn config(app: &Arc<App>) -> Response {
    let auth_required = app.auth_required();
    let public: Vec<String> = if auth_required {
        match app.store.buckets().await {
            Ok(buckets) => buckets.into_iter().filter(|b| b.public_read).map(|b| b.name).collect(),
            Err(e) => return error_response(&e.into()),
        }
    } else {
        Vec::new()
    };
    let mut r = json(StatusCode::OK, &json!({ "auth_required": auth_required, "public_buckets": public }));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An embedded file, with an ETag (the page revalidates it on every load:
/// a new binary serves new assets at once).
fn asset(req: &Request, content_type: &str, body: &'static str) -> Response {
    let etag = etag_of(body);
    let current = Validators { etag: etag.trim_matches('"'), modified: None };
    let fresh = conditional::evaluate(req.method(), req.headers(), Some(current)) == Verdict::NotModified;
    // hyper sends no body in answer to HEAD.
    let mut r = if fresh { empty(StatusCode::NOT_MODIFIED) } else { full(StatusCode::OK, content_type, body) };
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    r
}

/// A strong ETag for an embedded file (hashing a few kilobytes per request
/// costs microseconds).
fn etag_of(body: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("\"{:016x}-{:x}\"", hasher.finish(), body.len())
}
