//! The S3 bucket `depot import` reads from: its keys listed (ListObjectsV2,
//! with the keys URL-encoded) and read (GET) by requests we sign ourselves.
//! `object_store`, which the `s3` engine uses, keeps keys as paths, and a
//! path cannot hold every S3 key (control characters, empty segments, a
//! leading or trailing `/`): one such key failed the whole listing.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use http::{HeaderMap, Method, StatusCode};
use object_store::aws::AmazonS3;
use percent_encoding::{AsciiSet, percent_decode_str, utf8_percent_encode};
use serde::Deserialize;

use crate::engine::{S3Config, s3};
use crate::store::names::URL_PATH;

/// A query parameter's value: escaped as a key in a path is, and `/` too.
const QUERY: &AsciiSet = &URL_PATH.add(b'/');

pub struct S3Source {
    store: AmazonS3,
    region: String,
    bucket_url: String,
    /// Empty, or ending in `/`: the prefix is a folder, as `aws s3 cp
    /// --recursive` takes it.
    prefix: String,
    http: reqwest::Client,
}

/// One key as listed.
pub struct Listed {
    pub key: String,
    pub size: u64,
    pub modified: Option<SystemTime>,
}

/// A page of a ListObjectsV2 answer (`depot ls` reads depot's own too).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct ListBucketResult {
    #[serde(default)]
    pub contents: Vec<Contents>,
    /// The folders, when the request gave a delimiter.
    #[serde(default)]
    pub common_prefixes: Vec<CommonPrefix>,
    pub next_continuation_token: Option<String>,
    pub is_truncated: Option<bool>,
    pub encoding_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct Contents {
    pub key: String,
    pub size: u64,
    pub last_modified: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct CommonPrefix {
    pub prefix: String,
}

impl S3Source {
    pub fn open(endpoint: Option<&str>, config: &S3Config, prefix: &str) -> anyhow::Result<S3Source> {
        let builder = s3::builder(endpoint, config);
        let s3::Resolved { region, bucket_url, .. } = s3::resolve(&builder)?;
        let store = builder.build().context("configuring the S3 source")?;
        let http =
            reqwest::Client::builder().connect_timeout(s3::CONNECT_TIMEOUT).read_timeout(s3::READ_TIMEOUT).build()?;
        let prefix = match prefix {
            "" => String::new(),
            p if p.ends_with('/') => p.to_string(),
            p => format!("{p}/"),
        };
        Ok(S3Source { store, region, bucket_url, prefix, http })
    }

    /// The keys under the prefix, a page at a time.
    pub fn pages(&self) -> Pages<'_> {
        Pages { source: self, token: None, any: false, done: false }
    }

    /// A GET of `key`, answered with its headers and its body to come;
    /// `None` if there is no such key (any longer).
    pub async fn get(&self, key: &str) -> anyhow::Result<Option<reqwest::Response>> {
        let response = self.send(&format!("{}/{}", self.bucket_url, utf8_percent_encode(key, URL_PATH))).await?;
        match response.status() {
            s if s.is_success() => Ok(Some(response)),
            StatusCode::NOT_FOUND => Ok(None),
            status => bail!("the S3 server answered {status}: {}", error_summary(&response.text().await?)),
        }
    }

    /// A signed GET of `url`, tried again after a network error, a 5xx or a
    /// 429 as the engine's requests are: at most [`s3::MAX_RETRIES`] times
    /// within [`s3::RETRY_TIMEOUT`].
    async fn send(&self, url: &str) -> anyhow::Result<reqwest::Response> {
        let mut backoff = Duration::from_millis(100);
        let started = Instant::now();
        let mut attempt = 1;
        loop {
            let signed = s3::sign(&self.store, &self.region, &Method::GET, url, &HeaderMap::new()).await?;
            let failure = match self.http.get(url).headers(signed).send().await {
                Ok(r) if !(r.status().is_server_error() || r.status() == StatusCode::TOO_MANY_REQUESTS) => {
                    return Ok(r);
                }
                Ok(r) => anyhow::anyhow!("the S3 server answered {}", r.status()),
                Err(e) if e.is_connect() => {
                    anyhow::Error::new(e).context(format!("cannot reach the S3 server at {}", self.bucket_url))
                }
                Err(e) => {
                    anyhow::Error::new(e).context(format!("a request to the S3 server at {} failed", self.bucket_url))
                }
            };
            if attempt > s3::MAX_RETRIES || started.elapsed() > s3::RETRY_TIMEOUT {
                let elapsed = started.elapsed().as_secs_f64();
                return Err(failure.context(format!("after {attempt} tries in {elapsed:.1} s")));
            }
            attempt += 1;
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
}

/// A listing of an [`S3Source`], read page by page: the keys under its
/// prefix, with those that cannot be read by URL as problems (`Err`).
pub struct Pages<'a> {
    source: &'a S3Source,
    token: Option<String>,
    /// Whether any key was listed yet.
    any: bool,
    done: bool,
}

impl Pages<'_> {
    /// The next page's keys; `None` after the last page.
    pub async fn next(&mut self) -> anyhow::Result<Option<Vec<Result<Listed, String>>>> {
        if self.done {
            return Ok(None);
        }
        let source = self.source;
        let mut url = format!("{}?list-type=2&encoding-type=url", source.bucket_url);
        for (name, value) in [("prefix", Some(&source.prefix)), ("continuation-token", self.token.as_ref())] {
            if let Some(value) = value.filter(|v| !v.is_empty()) {
                url.push_str(&format!("&{name}={}", utf8_percent_encode(value, QUERY)));
            }
        }
        let response = source.send(&url).await?;
        let status = response.status();
        let body = response.text().await.context("reading a listing")?;
        if !status.is_success() {
            bail!("the S3 server answered {status}: {}", error_summary(&body));
        }
        let page: ListBucketResult =
            quick_xml::de::from_str(&body).context("the S3 server's listing is not one ListObjectsV2 gives")?;
        let encoded = page.encoding_type.as_deref() == Some("url");
        self.any |= !page.contents.is_empty();
        let found = page
            .contents
            .into_iter()
            .map(|item| {
                let key = match encoded {
                    true => listed_key(&item.key).ok_or_else(|| format!("{}: the key is not UTF-8", item.key))?,
                    false => item.key,
                };
                if key.split('/').any(|segment| segment == "." || segment == "..") {
                    // A URL's `.` and `..` segments are resolved, not sent.
                    return Err(format!("{key:?}: a key with a `.` or `..` segment cannot be read by URL"));
                }
                let modified = item.last_modified.and_then(|t| humantime::parse_rfc3339_weak(&t).ok());
                Ok(Listed { key, size: item.size, modified })
            })
            .collect();
        match page.next_continuation_token {
            Some(next) if !next.is_empty() => self.token = Some(next),
            _ if page.is_truncated == Some(true) => {
                bail!("the S3 server says its listing goes on, but gives no token to read the rest with")
            }
            // A mistyped prefix would read as an empty folder.
            _ if !self.any && !source.prefix.is_empty() => {
                bail!("nothing in the S3 bucket is under {:?}: check the prefix", source.prefix)
            }
            _ => self.done = true,
        }
        Ok(Some(found))
    }
}

/// The code and message of an S3 error document, or its start.
fn error_summary(body: &str) -> String {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Error {
        code: String,
        message: Option<String>,
    }
    match quick_xml::de::from_str::<Error>(body) {
        Ok(e) => format!("{}{}", e.code, e.message.map(|m| format!(": {m}")).unwrap_or_default()),
        Err(_) => body.chars().take(200).collect(),
    }
}

/// A key of a listing asked for with `encoding-type=url`, decoded as the
/// SDKs decode it: form encoding, where AWS sends a space as `+` (and a
/// `+` as `%2B`); other servers send a space as `%20`, which reads the
/// same. `None` when the bytes are not UTF-8.
fn listed_key(encoded: &str) -> Option<String> {
    percent_decode_str(&encoded.replace('+', " ")).decode_utf8().ok().map(|key| key.into_owned())
}

#[cfg(test)]
mod tests {
    #[test]
    fn listed_keys_are_form_decoded() {
        assert_eq!(super::listed_key("a+b.txt").as_deref(), Some("a b.txt"));
        assert_eq!(super::listed_key("a%20b.txt").as_deref(), Some("a b.txt"));
        assert_eq!(super::listed_key("a%2Bb.txt").as_deref(), Some("a+b.txt"));
        assert_eq!(super::listed_key("%C3%BCn%C3%AF/100%25").as_deref(), Some("ünï/100%"));
        assert_eq!(super::listed_key("%FF"), None);
    }
}
