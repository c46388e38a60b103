//! Listings of buckets and of keys, folder-style by `/`: JSON for programs
//! (`Accept: application/json`), an HTML page for browsers.

use std::sync::Arc;

use http::{StatusCode, header};
use serde::Serialize;
use serde_json::json;

use super::error::ApiError;
use super::native::{query, query_value};
use super::{App, Request, Response, full, json};
use crate::catalog::{ListQuery, from_millis};
use crate::store::names::{self, URL_PATH};

/// Most entries in one page.
const MAX_LIMIT: usize = 10_000;
const DEFAULT_LIMIT: usize = 1000;

pub(super) fn wants_json(req: &Request) -> bool {
    let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    accept.contains("application/json") || query_value(&query(req), "format") == Some("json")
}

/// A listing's form depends on `Accept`: caches must know (RFC 9110
/// section 12.5.5), or one would hand a browser's page to a program.
pub(super) fn negotiated(mut r: Response) -> Response {
    r.headers_mut().append(header::VARY, http::HeaderValue::from_static("Accept"));
    r
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(from_millis(ms)).to_string()
}

pub(super) async fn buckets(app: &Arc<App>, req: &Request) -> Result<Response, ApiError> {
    let mut buckets = app.store.buckets().await?;
    // With several accounts, each sees the buckets it may use.
    if app.several_accounts()
        && let Some(caller) = req.extensions().get::<super::Caller>()
    {
        buckets.retain(|b| super::may_use(b, &caller.access_key));
    }
    if wants_json(req) {
        let list: Vec<_> = buckets.iter().map(|b| json!({ "name": b.name, "created": rfc3339(b.created) })).collect();
        return Ok(negotiated(json(StatusCode::OK, &json!({ "buckets": list }))));
    }
    let mut rows = String::new();
    for b in &buckets {
        let href = escape(&percent_encoding::utf8_percent_encode(&b.name, URL_PATH).to_string());
        rows.push_str(&format!(
            "<tr><td><a href=\"/{href}/\">{}/</a></td><td>{}</td></tr>\n",
            escape(&b.name),
            rfc3339(b.created)
        ));
    }
    Ok(negotiated(page("Buckets", "<tr><th>Bucket</th><th>Created</th></tr>", &rows)))
}

/// A page of a listing as JSON, borrowing the catalog's records rather
/// than copying them: a page may hold 10,000 keys of up to 8 KB.
#[derive(Serialize)]
struct Listing<'a> {
    bucket: &'a str,
    prefix: &'a str,
    entries: Vec<Entry<'a>>,
    dirs: &'a [String],
    next: Option<&'a str>,
}

#[derive(Serialize)]
struct Entry<'a> {
    key: &'a str,
    size: u64,
    etag: &'a str,
    modified: String,
    content_type: &'a str,
}

pub(super) async fn objects(app: &Arc<App>, req: &Request, bucket: &str, folder: &str) -> Result<Response, ApiError> {
    let q = query(req);
    let limit = match query_value(&q, "limit") {
        None => DEFAULT_LIMIT,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| ApiError::bad_request(format!("limit must be a number from 1 to {MAX_LIMIT}")))?,
    };
    // `?prefix=` narrows a folder to the keys that start with more: a
    // search by prefix. The page still shows the folder's names, and its
    // parent.
    let prefix = &format!("{folder}{}", query_value(&q, "prefix").unwrap_or(""));
    let list = ListQuery {
        prefix: prefix.to_string(),
        after: query_value(&q, "after").map(str::to_string),
        delimiter: Some("/".into()),
        limit,
    };
    let page_of = app.store.list(bucket, &list).await?;
    if wants_json(req) {
        let entries = page_of
            .objects
            .iter()
            .map(|o| Entry {
                key: &o.key,
                size: o.size,
                etag: &o.etag,
                modified: rfc3339(o.shown_modified()),
                content_type: &o.content_type,
            })
            .collect();
        let body = Listing { bucket, prefix, entries, dirs: &page_of.prefixes, next: page_of.next.as_deref() };
        return Ok(negotiated(json(StatusCode::OK, &body)));
    }
    // Keys with `.` or `..` segments are linked so that a browser leaves
    // them be; a key that is nothing but one cannot be linked at all (a
    // browser would resolve the link to the folder or its parent), so
    // its name is shown alone.
    let cell = |key: &str, name: &str| match names::key_path(key) {
        Some(path) => format!("<a href=\"{}\">{}</a>", escape(&format!("/{bucket}/{path}")), escape(name)),
        None => escape(name),
    };
    let mut rows = String::new();
    if let Some(parent) = parent_of(folder) {
        rows.push_str(&format!("<tr><td>{}</td><td></td><td></td></tr>\n", cell(parent, "../")));
    }
    for d in &page_of.prefixes {
        rows.push_str(&format!("<tr><td>{}</td><td>-</td><td></td></tr>\n", cell(d, &d[folder.len()..])));
    }
    for o in &page_of.objects {
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            cell(&o.key, &o.key[folder.len()..]),
            o.size,
            rfc3339(o.shown_modified())
        ));
    }
    if let Some(next) = &page_of.next {
        let encode = |v: &str| percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string();
        // The next page of the same listing: the same search by prefix.
        let search = query_value(&q, "prefix").map(|p| format!("prefix={}&", encode(p))).unwrap_or_default();
        let href = format!("?{search}after={}&limit={limit}", encode(next));
        rows.push_str(&format!("<tr><td><a href=\"{}\">next page</a></td><td></td><td></td></tr>\n", escape(&href)));
    }
    let title = format!("/{bucket}/{prefix}");
    Ok(negotiated(page(&title, "<tr><th>Name</th><th>Size</th><th>Modified</th></tr>", &rows)))
}

/// The folder above `prefix` (`a/b/` → `a/`, `a/` → ``).
fn parent_of(prefix: &str) -> Option<&str> {
    let trimmed = prefix.strip_suffix('/')?;
    Some(trimmed.rfind('/').map_or("", |i| &trimmed[..=i]))
}

pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn page(title: &str, head: &str, rows: &str) -> Response {
    let title = escape(title);
    let html = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>{title}</title><style>body{{font:14px system-ui,sans-serif;margin:2em}}td,th{{padding:2px 12px;text-align:left}}</style>\
         </head><body><h1>{title}</h1><table>{head}\n{rows}</table></body></html>\n"
    );
    full(StatusCode::OK, "text/html; charset=utf-8", html)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents() {
        assert_eq!(parent_of(""), None);
        assert_eq!(parent_of("a/"), Some(""));
        assert_eq!(parent_of("a/b/"), Some("a/"));
    }

    #[test]
    fn escapes_html() {
        assert_eq!(escape("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
    }
}
