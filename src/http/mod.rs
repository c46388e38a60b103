//! HTTP: one port, one URL space. This module runs the connections and
//! turns each request into a store call through [`native`]; errors become
//! responses in [`error`], once.

mod batch;
pub mod conditional;
pub mod error;
#[cfg(test)]
mod fault_tests;
#[doc(hidden)]
pub mod fuzzing;
mod limits;
mod listing;
pub mod log;
pub mod metrics;
mod native;
pub mod range;
mod s3;
mod sendfile;
mod ui;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::TryStreamExt;
use http::{HeaderValue, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::config::Credential;
use crate::store::Store;
use error::ApiError;
use metrics::Metrics;

pub type Body = UnsyncBoxBody<Bytes, io::Error>;
pub type Response = http::Response<Body>;
pub type Request = http::Request<RequestBody>;

pub use limits::{BodyError, Limits, RequestBody};

/// Who sent a native request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Caller {
    /// The credential's access key; empty on a store without credentials.
    pub access_key: String,
    /// The first credential (or anyone, without credentials): the one that
    /// may use the routes that see past bucket owners (backups, blobs by
    /// their address, totals). Other accounts' buckets stay theirs.
    pub operator: bool,
}

/// Whether `access_key` may use the bucket: its own, or one made without
/// credentials, which every credential shares.
pub(crate) fn may_use(bucket: &crate::catalog::BucketRecord, access_key: &str) -> bool {
    bucket.owner.is_empty() || bucket.owner == access_key
}

/// What every request handler shares.
pub struct App {
    pub store: Arc<Store>,
    pub limits: Limits,
    pub metrics: Metrics,
    /// The credentials, whose secrets are accepted as `Authorization:
    /// Bearer`; none: no authentication.
    credentials: Vec<Credential>,
    s3: s3s::service::S3Service,
    /// One permit per request body being read: `limits.max_uploads`.
    uploads: Arc<tokio::sync::Semaphore>,
    /// On a server without credentials that listens on a loopback address:
    /// the names requests may address it by besides loopback ones (see
    /// [`foreign_host`]).
    local_names: Option<Vec<String>>,
    /// The data directory's local token ([`LOCAL_TOKEN_FILE`]).
    local_token: Option<String>,
    /// The domain of virtual-host style S3 requests (`BUCKET.DOMAIN`).
    s3_domain: Option<String>,
}

/// The file of the data directory that holds the server's local token,
/// made at the first start, readable by its owner only: a request that
/// carries it (in [`LOCAL_TOKEN_HEADER`]) comes from someone who may read
/// the data directory, on the server's machine. That is who may ask a
/// server without credentials for a backup (`depot backup`); the peer's
/// address cannot tell, behind a proxy on the same machine. Nodes that
/// share a data directory share it.
pub const LOCAL_TOKEN_FILE: &str = "local-token";

/// The header that carries the local token.
pub const LOCAL_TOKEN_HEADER: &str = "x-depot-local-token";

/// The local token of `data`, made if there is none yet. One that is not
/// a regular file of this user's that only it may read (a link, say,
/// planted where others may write) is replaced.
fn local_token(data: &std::path::Path) -> std::io::Result<String> {
    use std::io::{Read, Write};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = data.join(LOCAL_TOKEN_FILE);
    // Each pass removes a token it cannot take, or makes one: another
    // process that makes one meanwhile ends it.
    for _ in 0..4 {
        let mut found = String::new();
        let read =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).and_then(|mut file| {
                let meta = file.metadata()?;
                // SAFETY: geteuid takes nothing and cannot fail.
                let me = unsafe { libc::geteuid() };
                let owned = meta.is_file() && meta.uid() == me && meta.mode() & 0o077 == 0;
                if owned {
                    file.read_to_string(&mut found)?;
                }
                Ok(owned)
            });
        match read {
            Ok(true) if found.len() == 64 && found.bytes().all(|b| b.is_ascii_hexdigit()) => return Ok(found),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Not ours alone, a link (`ELOOP` under `O_NOFOLLOW`), damaged.
            _ => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
        // Written whole under a name of this process's, then linked into
        // place unless another process was first: never seen half written,
        // never replaced.
        let token = hex::encode(rand::random::<[u8; 32]>());
        let fresh = data.join(format!("{LOCAL_TOKEN_FILE}.{}", hex::encode(rand::random::<[u8; 8]>())));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&fresh)
            .and_then(|mut file| file.write_all(token.as_bytes()))
            .and_then(|()| std::fs::hard_link(&fresh, &path));
        let _ = std::fs::remove_file(&fresh);
        match written {
            Ok(()) => return Ok(token),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("another process keeps replacing it"))
}

impl App {
    /// `s3_domain` enables virtual-host style S3 requests; `listen` is the
    /// address the server listens on, and `allowed_hosts` the names it
    /// answers to besides local ones when it has no credentials.
    pub fn new(
        store: Store,
        limits: Limits,
        credentials: &[Credential],
        s3_domain: Option<&str>,
        listen: std::net::SocketAddr,
        allowed_hosts: &[String],
    ) -> anyhow::Result<App> {
        let store = Arc::new(store);
        let s3 = s3::service(store.clone(), credentials, s3_domain)?;
        let local_names = (credentials.is_empty() && listen.ip().to_canonical().is_loopback()).then(|| {
            s3_domain.into_iter().chain(allowed_hosts.iter().map(String::as_str)).map(str::to_string).collect()
        });
        let credentials = credentials.to_vec();
        let uploads = Arc::new(tokio::sync::Semaphore::new(limits.max_uploads));
        // Without one, backups need credentials; the store serves anyway
        // (a data directory where links cannot be made, or read-only).
        let local_token = store.data_dir().and_then(|data| match local_token(data) {
            Ok(token) => Some(token),
            Err(e) => {
                let path = data.join(LOCAL_TOKEN_FILE);
                tracing::warn!("no local token at {} ({e}): backups need credentials", path.display());
                None
            }
        });
        let s3_domain = s3_domain.map(str::to_ascii_lowercase);
        Ok(App {
            store,
            limits,
            metrics: Metrics::default(),
            credentials,
            s3,
            uploads,
            local_names,
            local_token,
            s3_domain,
        })
    }

    /// Whether `req` comes from this machine: from a loopback address, or
    /// from the address it reached (one of this machine's).
    pub(crate) fn sent_here<B>(&self, req: &http::Request<B>) -> bool {
        req.extensions().get::<Peer>().is_some_and(|peer| {
            let from = peer.addr.ip().to_canonical();
            from.is_loopback() || peer.local.is_some_and(|to| to.ip().to_canonical() == from)
        })
    }

    /// Whether `req` carries the local token ([`LOCAL_TOKEN_FILE`]).
    pub(crate) fn carries_local_token<B>(&self, req: &http::Request<B>) -> bool {
        use subtle::ConstantTimeEq;
        let given = req.headers().get(LOCAL_TOKEN_HEADER).map(HeaderValue::as_bytes);
        matches!((given, &self.local_token), (Some(given), Some(token)) if bool::from(given.ct_eq(token.as_bytes())))
    }

    /// Whether `req` names a bucket by its host (`BUCKET.DOMAIN`, virtual-host
    /// style S3): its whole path is then a key, never one of the server's
    /// own routes (`/_/...`) or pages.
    fn to_bucket_host<B>(&self, req: &http::Request<B>) -> bool {
        let Some(domain) = &self.s3_domain else { return false };
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).or_else(|| req.uri().host());
        host.is_some_and(|host| s3::bucket_in_host(host, domain).is_some())
    }

    /// Whether requests need a secret or a signature.
    pub fn auth_required(&self) -> bool {
        !self.credentials.is_empty()
    }

    /// Whether buckets may belong to different accounts: there are several
    /// credentials.
    pub(crate) fn several_accounts(&self) -> bool {
        self.credentials.len() > 1
    }

    /// Who sent a native request: anyone without configured credentials,
    /// anyone for the health check, else the credential whose secret is
    /// the Bearer token (compared in constant time with every secret).
    /// `None`: not authorized.
    fn caller<B>(&self, req: &http::Request<B>) -> Option<Caller> {
        use subtle::ConstantTimeEq;
        if self.credentials.is_empty() {
            return Some(Caller { access_key: String::new(), operator: true });
        }
        if req.uri().path() == "/_/health" {
            return Some(Caller { access_key: String::new(), operator: false });
        }
        let token = bearer_token(req.headers())?;
        let mut found = None;
        for (i, c) in self.credentials.iter().enumerate() {
            if bool::from(c.secret_key.as_bytes().ct_eq(token.as_bytes())) {
                found = Some(i);
            }
        }
        found.map(|i| Caller { access_key: self.credentials[i].access_key.clone(), operator: i == 0 })
    }

    /// Answers one request; never fails (errors are responses). Every
    /// response carries the request's ID, and so does every line logged
    /// while answering it (see [`log`]).
    pub async fn handle(self: Arc<Self>, req: http::Request<Incoming>) -> Response {
        let id = request_id(req.headers());
        let (method, uri) = (req.method().clone(), req.uri().clone());
        // Boxed: see `answer`.
        let mut response = log::scope(id.clone(), Box::pin(self.respond(req, &id))).await;
        let status = response.status();
        if status.is_server_error() {
            tracing::warn!(%method, path = uri.path(), status = status.as_u16(), request_id = %id, "request failed");
        } else if status.is_client_error() {
            tracing::debug!(%method, path = uri.path(), status = status.as_u16(), request_id = %id, "request refused");
        }
        if let Ok(v) = HeaderValue::from_str(&id) {
            response.headers_mut().insert(REQUEST_ID, v.clone());
            response.headers_mut().insert(AMZ_REQUEST_ID, v);
        }
        response
    }

    async fn respond(self: Arc<Self>, req: http::Request<Incoming>, id: &str) -> Response {
        let started = Instant::now();
        let method = req.method().clone();
        let linger = req.extensions().get::<Peer>().map(|p| p.linger.clone());
        // Requests without credentials on a server that has them are
        // anonymous S3 requests: the S3 policy lets them read public-read
        // buckets and answers everything else with AccessDenied.
        let caller = self.caller(&req);
        let authorized = caller.is_some();
        let s3 = s3::is_s3(&req) || !authorized;
        let has_body = limits::has_body(req.headers());
        let body = limits::BodyState::default();
        let mut req = req.map(|b| RequestBody::new(b, self.limits.body_timeout, body.clone()));
        if let Some(caller) = caller {
            req.extensions_mut().insert(caller);
        }
        let mut response = self.clone().answer(req, s3, !authorized, id).await;
        let refused = response.status().is_client_error() || response.status().is_server_error();
        // A body that stopped coming is a timeout, whatever the handler
        // made of the failed read (native answers only: S3 clients get the
        // S3 error s3s chose).
        if body.timed_out() && refused && !s3 {
            let e = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "RequestTimeout",
                limits::too_slow(self.limits.body_timeout),
            );
            response = error_response(&e);
        }
        // A refusal sent before any 100 Continue, or before the body was
        // read to its end, leaves the body unsent or unread: the connection
        // cannot carry another request (the server would read the rest of
        // the body as the next request), so the answer says it closes, and
        // the connection closes gently. A request with no body, or whose
        // body was read, leaves the connection as it found it, whether it
        // asked for 100 Continue or not (RFC 9110 section 10.1.1).
        if refused && has_body && !body.ended() {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            if let Some(linger) = linger {
                linger.ask();
            }
        }
        // What a native request is answered for its Bearer token is the
        // caller's: a browser may keep it only to ask again (RFC 9111
        // section 5.2.2.4). Kept as fresh for a while by its Last-Modified,
        // a private object read through the web UI would be shown from the
        // cache after sign-out, to anyone. An object's own Cache-Control
        // stands, and S3 answers keep S3's headers, which SDKs report and
        // copy.
        if self.auth_required() && authorized && !s3 && !response.headers().contains_key(header::CACHE_CONTROL) {
            response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
        }
        // A HEAD answer's length is the object's; it sends none of it.
        let bytes_out = if method == http::Method::HEAD { 0 } else { content_length(response.headers()).unwrap_or(0) };
        self.metrics.record(&method, response.status().as_u16(), started.elapsed(), body.read(), bytes_out);
        response
    }

    async fn answer(self: Arc<Self>, req: Request, s3: bool, anonymous: bool, id: &str) -> Response {
        // RFC 9112 section 3.2: an HTTP/1.1 request without a Host, or
        // any request with more than one, is a 400.
        let hosts = req.headers().get_all(header::HOST).iter().count();
        if hosts > 1 || (hosts == 0 && req.version() == http::Version::HTTP_11) {
            let e = ApiError::bad_request("a request needs one Host header (HTTP/1.0: at most one)");
            let mut r = error_response(&e);
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        if let Some(names) = &self.local_names
            && let Some(host) = foreign_host(&req, names)
        {
            return error_response(&ApiError::access_denied(format!(
                "this server has no credentials and listens on a loopback address, so it answers requests \
                 addressed to localhost, an IP address or a name without dots, not to {host:?} (a page of \
                 another site that points its name at this machine could use the store); give the server \
                 credentials, or name it with --allowed-host (as behind a reverse proxy)"
            )));
        }
        // RFC 9112 section 6.1: a transfer coding other than chunked is one
        // the server cannot undo; storing the coded bytes as the body would
        // be wrong, so it is a 501 and the body stays unread.
        // Chunked may be applied once only: decoded once, a body coded
        // twice would end elsewhere than a proxy in front believes.
        let codings: Option<Vec<&str>> = req
            .headers()
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .map(|v| v.to_str().ok())
            .collect::<Option<Vec<_>>>()
            .map(|lines| lines.iter().flat_map(|l| l.split(',')).map(str::trim).collect());
        let refusal = match codings.as_deref() {
            None => Some(ApiError::bad_request("Transfer-Encoding is not text")),
            Some([]) => None,
            Some([one]) if one.eq_ignore_ascii_case("chunked") => None,
            Some(c) if c.iter().all(|c| c.eq_ignore_ascii_case("chunked")) => {
                Some(ApiError::bad_request("the chunked transfer coding is applied more than once"))
            }
            Some(c) => Some(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "NotImplemented",
                format!("transfer coding {:?}: only chunked is supported", c.join(", ")),
            )),
        };
        if let Some(e) = refusal {
            let mut r = error_response(&e);
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        // With credentials, a request proves itself by its signature or
        // secret, which a page of another site does not have: a browser
        // form signed for this server may be posted from any page.
        if !self.auth_required()
            && let Some(origin) = cross_origin_change(&req)
        {
            return error_response(&ApiError::access_denied(format!(
                "a page of another origin ({origin}) may not change the store"
            )));
        }
        // A Bearer token that is no configured secret is refused as such,
        // rather than passed to the S3 layer as an unreadable signature.
        if anonymous && bearer_token(req.headers()).is_some() {
            return error_response(&ApiError::access_denied("the Bearer token is not a configured secret"));
        }
        let to_bucket = self.to_bucket_host(&req);
        if !to_bucket && let Some(r) = ui::answer(&self, &req, anonymous).await {
            return r;
        }
        // The server's own routes (batches, stats, metrics, blobs, backups)
        // are not buckets: an anonymous request for one is refused here
        // rather than answered by the S3 layer as a bad bucket name.
        if anonymous && !to_bucket && req.uri().path().starts_with("/_/") {
            return error_response(&ApiError::access_denied(
                "this route needs credentials: send Authorization: Bearer <secret>",
            ));
        }
        // Held until the answer is made, which for uploads is after the
        // body has been read.
        let _permit = match limits::has_body(req.headers()) {
            false => None,
            true => match self.uploads.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => return self.slow_down(s3, id),
            },
        };
        if s3 {
            // A browser's read of the same URL gets the page (above).
            let varies = !to_bucket && ui::may_be_page(&req, anonymous);
            // Boxed, as the native routes are (below).
            let mut r = Box::pin(s3::handle(&self.s3, req, anonymous, id)).await;
            if varies {
                r.headers_mut().append(header::VARY, HeaderValue::from_static("Accept"));
            }
            r
        } else {
            // A future holds the future it awaits, at about twice its size,
            // and is moved whole when it starts: a route's kilobytes of
            // state, unboxed, were moved and doubled at every level up to
            // hyper (a 53 KB future per request).
            let route = Box::pin(native::route(&self, req));
            match route.await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            }
        }
    }

    /// 503 with Retry-After, for an upload beyond `max_uploads` (S3's
    /// SlowDown for S3 requests).
    fn slow_down(&self, s3: bool, id: &str) -> Response {
        let message = format!("{} uploads are in progress; retry later", self.limits.max_uploads);
        let mut r = if s3 {
            s3::slow_down(message, id)
        } else {
            error_response(&ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "SlowDown", message))
        };
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    }
}

const REQUEST_ID: header::HeaderName = header::HeaderName::from_static("x-request-id");
const AMZ_REQUEST_ID: header::HeaderName = header::HeaderName::from_static("x-amz-request-id");

/// The token of `Authorization: Bearer <token>`. The scheme is a token
/// matched without regard to case (RFC 9110, section 11.1), and any
/// spaces may stand between it and the token.
fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    let (scheme, token) = headers.get(header::AUTHORIZATION)?.to_str().ok()?.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The client's `X-Request-Id` when it is a sane token (so a proxy's IDs
/// carry through), else a new random one.
fn request_id(headers: &http::HeaderMap) -> String {
    let given = headers.get(REQUEST_ID).and_then(|v| v.to_str().ok()).filter(|v| {
        (1..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    });
    given.map_or_else(
        || {
            let mut id = [0; 16];
            hex::encode_to_slice(rand::random::<u64>().to_be_bytes(), &mut id).expect("16 digits for 8 bytes");
            String::from_utf8(id.to_vec()).expect("hex is ASCII")
        },
        str::to_string,
    )
}

/// The digest a `Content-MD5` header declares (base64 of 16 bytes).
pub(crate) fn content_md5(value: &str) -> Result<[u8; 16], ApiError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .ok()
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .ok_or_else(|| {
            ApiError::new(StatusCode::BAD_REQUEST, "InvalidDigest", "Content-MD5 must be the base64 of 16 bytes")
        })
}

pub(crate) fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// A JSON error body: `{"error": code, "message": ...}`.
pub fn error_response(e: &ApiError) -> Response {
    let body = serde_json::json!({ "error": e.code, "message": e.message });
    let mut r = json(e.status, &body);
    if let Some(allow) = e.allow {
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    r
}

/// The origin of a browser page of another origin that asks for a change.
/// A page may send a POST with a simple body to any server without asking
/// it first (CORS lets it through, only hiding the answer), so on a server
/// without credentials any web site could write batches, delete or start
/// backups through its visitors' browsers. Browsers name the sending page
/// in `Origin`; clients that are not browsers send none, and same-origin
/// pages (the web UI) name this server.
fn cross_origin_change<B>(req: &http::Request<B>) -> Option<String> {
    if matches!(*req.method(), http::Method::GET | http::Method::HEAD | http::Method::OPTIONS) {
        return None;
    }
    let origin = req.headers().get(header::ORIGIN)?;
    let authority = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, a)| a);
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    match (authority, host) {
        (Some(a), Some(h)) if a.eq_ignore_ascii_case(h) => None,
        _ => Some(String::from_utf8_lossy(origin.as_bytes()).into_owned()),
    }
}

/// The name a request addresses the server by when it is none a server
/// without credentials on a loopback address should answer to. A page of
/// another site can point its own name at 127.0.0.1 (DNS rebinding): the
/// browser then sends the user's requests here as that page's own, with
/// its name in Host and as the Origin, so neither the loopback address nor
/// the Origin check stops them. Such a name is a registered one, with a
/// dot; so are not localhost and its subdomains, IP addresses, names
/// without a dot (set in a hosts file or a search domain, not by a
/// stranger) and `names` (the S3 domain and its buckets' names).
fn foreign_host<B>(req: &http::Request<B>, names: &[String]) -> Option<String> {
    // Read in place, without a lowered copy: this is on every request of
    // such a server.
    let host = req.headers().get(header::HOST)?.as_bytes();
    let refused = || Some(String::from_utf8_lossy(host).into_owned());
    if let Some(v6) = host.strip_prefix(b"[") {
        let address = v6.split(|b| *b == b']').next().and_then(|a| std::str::from_utf8(a).ok());
        return match address.is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok()) {
            true => None,
            false => refused(),
        };
    }
    let name = host.iter().rposition(|b| *b == b':').map_or(host, |colon| &host[..colon]);
    let name = name.strip_suffix(b".").unwrap_or(name);
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    // `name` is `n` or a name under it.
    let under = |n: &[u8]| {
        is(n)
            || (name.len() > n.len()
                && name[name.len() - n.len() - 1] == b'.'
                && name[name.len() - n.len()..].eq_ignore_ascii_case(n))
    };
    let allowed = !name.contains(&b'.')
        || under(b"localhost")
        || std::str::from_utf8(name).is_ok_and(|n| n.parse::<std::net::Ipv4Addr>().is_ok())
        || names.iter().any(|n| under(n.as_bytes()));
    if allowed { None } else { refused() }
}

/// Headers for a stored object's answer, on either API. Uploaded pages
/// (HTML, SVG and every other XML, multipart bodies a browser may render)
/// would run in the web UI's origin, where the UI keeps its secret: they
/// get a sandbox, an origin of their own (their scripts still run). So does
/// a type that is not one plain `type/subtype`: browsers read a list such
/// as `text/plain,text/html` by its last entry, so only a type read the
/// same way here and by the browser may go without. Other types are left
/// alone: a sandbox stops browsers from showing PDFs. And no type is
/// guessed over the one stored.
pub(crate) fn object_safety(h: &mut http::HeaderMap, content_type: &str) {
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Compared in place, without a lower-cased copy: this is on every GET.
    let essence = content_type.split(';').next().unwrap_or("").trim().as_bytes();
    let is = |t: &str| essence.eq_ignore_ascii_case(t.as_bytes());
    let ends =
        |t: &str| essence.len() >= t.len() && essence[essence.len() - t.len()..].eq_ignore_ascii_case(t.as_bytes());
    let starts = |t: &str| essence.len() >= t.len() && essence[..t.len()].eq_ignore_ascii_case(t.as_bytes());
    let token =
        |part: &[u8]| !part.is_empty() && part.iter().all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(b));
    let plain = !content_type.contains(',')
        && matches!(essence.iter().position(|b| *b == b'/'), Some(i) if token(&essence[..i]) && token(&essence[i + 1..]));
    let active = !plain
        || ["text/html", "text/xml", "application/xml", "text/xsl"].into_iter().any(is)
        || ends("+xml")
        || starts("multipart/");
    if active {
        let policy = "sandbox allow-scripts allow-forms allow-popups allow-downloads";
        h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy));
    }
}

pub fn full(status: StatusCode, content_type: &str, bytes: impl Into<Bytes>) -> Response {
    let bytes = bytes.into();
    let len = bytes.len();
    let mut r = http::Response::new(Full::new(bytes).map_err(|e: Infallible| match e {}).boxed_unsync());
    *r.status_mut() = status;
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    // Listings, errors and the server's own answers are what they say.
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_LENGTH, len.into());
    r
}

pub fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    // Answers are values and structs of strings and numbers, which always
    // serialise.
    let mut body = serde_json::to_vec(value).expect("answers serialise");
    body.push(b'\n');
    full(status, "application/json", body)
}

pub fn empty(status: StatusCode) -> Response {
    let mut r = http::Response::new(http_body_util::Empty::new().map_err(|e: Infallible| match e {}).boxed_unsync());
    *r.status_mut() = status;
    *r.headers_mut() = http::HeaderMap::with_capacity(OBJECT_HEADERS);
    r
}

/// Room for the headers of an object's answer, made once rather than grown
/// twice as they are added.
const OBJECT_HEADERS: usize = 16;

/// A streamed body; `len` is sent as Content-Length.
pub fn streamed(status: StatusCode, len: u64, stream: crate::engine::ByteStream) -> Response {
    let body = StreamBody::new(stream.map_ok(Frame::data).map_err(io::Error::other));
    let mut r = http::Response::new(body.boxed_unsync());
    *r.status_mut() = status;
    *r.headers_mut() = http::HeaderMap::with_capacity(OBJECT_HEADERS);
    r.headers_mut().insert(header::CONTENT_LENGTH, len.into());
    r
}

/// Accepts connections until `shutdown` resolves and serves them on
/// `threads` threads, then lets requests in flight finish (for at most
/// `drain`).
///
/// Each thread runs a single-threaded runtime of its own and keeps every
/// connection it is given, as nginx's worker processes do: a request never
/// changes threads. Under one multi-threaded runtime, two workers on two
/// cores woke each other every few requests (a futex and an
/// inter-processor interrupt each), and a small GET spent more of the
/// CPU's time on those wake-ups than in depot's code. This task accepts,
/// and hands each connection to the thread serving the fewest: threads
/// that accepted for themselves took turns unevenly, and a burst of new
/// connections could land mostly on one. Work that blocks still goes to a
/// blocking pool, and the MD5 of large uploads to a thread of its own (see
/// `store::hashes`).
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    threads: usize,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> io::Result<()> {
    let http1 = http1_builder(&app.limits);
    let drained = Arc::new(tokio::sync::Barrier::new(threads.max(1)));
    let workers = (0..threads.max(1))
        .map(|i| Worker::start(i, app.clone(), http1.clone(), drain, drained.clone()))
        .collect::<io::Result<Vec<_>>>()?;
    tokio::pin!(shutdown);
    // A slot per open connection: at the limit, new ones wait in the
    // listen queue, as each may hold a request head in memory.
    let slots = Arc::new(tokio::sync::Semaphore::new(app.limits.max_connections));
    let mut warned: Option<std::time::Instant> = None;
    let mut last_accept_warning: Option<std::time::Instant> = None;
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if warned.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                    warned = Some(std::time::Instant::now());
                    let most = app.limits.max_connections;
                    tracing::warn!("{most} connections are open (--max-connections); new ones wait until one closes");
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => slot.expect("the slots are never closed"),
                    () = &mut shutdown => break,
                }
            }
        };
        let accepted: (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause, go on,
                    // and say so once a second at most.
                    if last_accept_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        tracing::warn!("accept failed: {e}");
                        last_accept_warning = Some(std::time::Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(worker) = workers.iter().min_by_key(|w| w.open.load(Ordering::Relaxed)) else {
            break;
        };
        // The socket moves to the thread's own runtime; registered with
        // this one, its readiness would wake this thread.
        let (stream, peer) = accepted;
        match stream.into_std() {
            Ok(stream) => {
                worker.open.fetch_add(1, Ordering::Relaxed);
                if worker.give.send(Connection { stream, peer, slot }).is_err() {
                    return Err(io::Error::other("a connection thread stopped"));
                }
            }
            Err(e) => tracing::warn!(%peer, "could not hand the connection over: {e}"),
        }
    }
    drop(listener);
    // Dropping every sender first lets the threads drain all at once.
    let finished: Vec<_> = workers.into_iter().map(|w| w.finished).collect();
    for finished in finished {
        if finished.await.is_err() {
            return Err(io::Error::other("a connection thread failed"));
        }
    }
    Ok(())
}

/// Who sent a request, to which of the server's addresses, and how to
/// close its connection.
#[derive(Clone)]
pub(crate) struct Peer {
    addr: SocketAddr,
    local: Option<SocketAddr>,
    linger: sendfile::Linger,
}

/// An accepted connection, on its way to the thread that serves it.
struct Connection {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    /// Its place among `max_connections`, given back when it closes.
    slot: tokio::sync::OwnedSemaphorePermit,
}

/// A thread serving connections, as the acceptor sees it.
struct Worker {
    /// Hands the thread a connection.
    give: tokio::sync::mpsc::UnboundedSender<Connection>,
    /// Connections the thread is serving.
    open: Arc<AtomicUsize>,
    /// Answers once the thread has drained, when `give` is dropped.
    finished: tokio::sync::oneshot::Receiver<()>,
}

impl Worker {
    fn start(
        i: usize,
        app: Arc<App>,
        http1: hyper::server::conn::http1::Builder,
        drain: Duration,
        drained: Arc<tokio::sync::Barrier>,
    ) -> io::Result<Worker> {
        let (give, given) = tokio::sync::mpsc::unbounded_channel();
        let open = Arc::new(AtomicUsize::new(0));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (done, finished) = tokio::sync::oneshot::channel();
        let counted = open.clone();
        std::thread::Builder::new().name(format!("depot-http-{i}")).spawn(move || {
            runtime.block_on(async {
                connections(given, counted, app, http1, drain).await;
                // Driven on until every thread has drained (or could have):
                // the connections to a catalog's or an engine's server that
                // a pool made on this thread serve the others' requests too.
                let _ = tokio::time::timeout(drain + Duration::from_secs(1), drained.wait()).await;
            });
            // The tasks of connections still open after the drain go with
            // the runtime, and with them what they hold of the store: it
            // closes before the server is told this thread is done, not
            // while the process exits (which aborted it now and then).
            drop(runtime);
            let _ = done.send(());
        })?;
        Ok(Worker { give, open, finished })
    }
}

/// The settings of every HTTP/1.1 connection.
fn http1_builder(limits: &Limits) -> hyper::server::conn::http1::Builder {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(Some(limits.header_timeout))
        // max_buf_size alone is no limit on the head: a single read can
        // fill the buffer past it, and a head that arrives whole in that
        // read is then accepted. max_header_size is checked on the parsed
        // head, so an oversized one always gets 431.
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(8192))
        // A client may close its side once its request is sent (`shutdown`
        // of writing, as `nc -N` does): the request is still answered,
        // rather than dropped with its outcome unknown to the client.
        .half_close(true)
        // Bodies are handed to the socket as they are, never copied into
        // hyper's buffer: a mapped chunk is then sent with `sendfile`.
        .writev(true)
        .keep_alive(true);
    // Hyper's own limit parses into an array on the stack; any limit set,
    // even the same number, into one it fills anew for every request.
    if limits.max_headers != HYPER_MAX_HEADERS {
        http1.max_headers(limits.max_headers);
    }
    http1
}

/// How many headers hyper accepts when told no limit.
const HYPER_MAX_HEADERS: usize = 100;

/// A connection counted in a thread's `open` until its task ends, however
/// it ends (a panic included).
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One thread's loop: serves the connections it is `given` on this thread
/// (counting them in `open`) until the acceptor stops, then waits for them
/// (at most `drain`).
async fn connections(
    mut given: tokio::sync::mpsc::UnboundedReceiver<Connection>,
    open: Arc<AtomicUsize>,
    app: Arc<App>,
    http1: hyper::server::conn::http1::Builder,
    drain: Duration,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    while let Some(Connection { stream, peer, slot }) = given.recv().await {
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(s) => s,
            Err(e) => {
                open.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(%peer, "could not serve the connection: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().ok();
        // A client that stops reading an answer, with the socket's buffers
        // full, is let go after the send timeout, as nginx's send_timeout.
        let linger = sendfile::Linger::default();
        let stream = sendfile::Socket::new(stream, linger.clone(), slot, app.limits.send_timeout);
        let app = app.clone();
        let asked = Arc::new(AtomicBool::new(false));
        let service = hyper::service::service_fn({
            let asked = asked.clone();
            move |mut req: http::Request<Incoming>| {
                asked.store(true, Ordering::Relaxed);
                req.extensions_mut().insert(Peer { addr: peer, local, linger: linger.clone() });
                let app = app.clone();
                async move { Ok::<_, Infallible>(app.handle(req).await) }
            }
        });
        let conn = graceful.watch(http1.serve_connection(TokioIo::new(stream), service));
        let (counted, mut stopping) = (Counted(open.clone()), stopping.clone());
        // hyper's graceful shutdown closes a connection between requests,
        // but one that never sent a request head (a browser's preconnect,
        // a scanner) would hold the drain until its header timeout: it is
        // dropped when the server stops, as no request of it was taken.
        let never_asked = async move {
            let _ = stopping.wait_for(|stop| *stop).await;
            if asked.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
        };
        tokio::spawn(async move {
            let _counted = counted;
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(%peer, "connection ended: {e}");
                },
                () = never_asked => tracing::debug!(%peer, "closed unused as the server stops"),
            }
        });
    }
    let _ = stop.send(true);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => tracing::warn!("requests still running after {drain:?}; stopping anyway"),
    }
}

#[cfg(test)]
mod tests {
    /// The token is made once and kept across starts; one damaged, one
    /// others may read, and a link (to nothing, or to a file someone else
    /// chose) are made anew.
    #[test]
    fn the_local_token_is_made_once_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::LOCAL_TOKEN_FILE);
        let first = super::local_token(dir.path()).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(super::local_token(dir.path()).unwrap(), first);
        let planted = "a".repeat(64);
        let chosen = dir.path().join("chosen");
        std::fs::write(&chosen, &planted).unwrap();
        std::fs::set_permissions(&chosen, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut seen = vec![first];
        for plant in ["damaged", "readable", "link to nothing", "link"] {
            std::fs::remove_file(&path).unwrap();
            match plant {
                "damaged" => std::fs::write(&path, "cut sh").unwrap(),
                "readable" => {
                    std::fs::write(&path, &planted).unwrap();
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
                }
                "link to nothing" => std::os::unix::fs::symlink(dir.path().join("nothing"), &path).unwrap(),
                _ => std::os::unix::fs::symlink(&chosen, &path).unwrap(),
            }
            let made = super::local_token(dir.path()).unwrap();
            assert!(made.len() == 64 && made != planted && !seen.contains(&made), "{plant}");
            assert!(std::fs::symlink_metadata(&path).unwrap().is_file(), "{plant}");
            seen.push(made);
        }
        let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["chosen", super::LOCAL_TOKEN_FILE], "nothing else is left");
        assert_eq!(std::fs::read_to_string(&chosen).unwrap(), planted, "a link's target is left alone");
    }
}
